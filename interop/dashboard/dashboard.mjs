// Drives the lanemq web dashboard in Debian's headless chromium through playwright-core.
// Run by interop/dashboard.sh (which starts the broker and mosquitto_sub); prints one
// "PASS: name" or "FAIL: name -- reason" line per check and "dashboard: done" at the end.
//
// Environment: DASH_URL (http://127.0.0.1:PORT), DASH_TOKEN, MQTT_PORT, WATCHER_PID (the
// mosquitto_sub -i dash-watcher), WORK (screenshots, browser profile), SHOTS_DIR (optional:
// also write the docs screenshots there), CHROMIUM (default /usr/bin/chromium).
import { chromium } from 'playwright-core';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';

const URL_ = process.env.DASH_URL;
const TOKEN = process.env.DASH_TOKEN;
const MQTT_PORT = process.env.MQTT_PORT;
const WATCHER_PID = Number(process.env.WATCHER_PID || 0);
const WORK = process.env.WORK;
const SHOTS_DIR = process.env.SHOTS_DIR || '';
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const WAIT = 8000; // default bound of every wait (ms)

let failures = 0;
const pass = (name) => console.log(`PASS: ${name}`);
const fail = (name, why) => {
  failures++;
  console.log(`FAIL: ${name} -- ${String(why).split('\n')[0]}`);
};
/** Runs one check; a thrown error is its FAIL line. */
async function check(name, fn) {
  try {
    await fn();
    pass(name);
    return true;
  } catch (e) {
    fail(name, e && e.message ? e.message : e);
    return false;
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function mqttPub(topic, message) {
  const r = spawnSync('mosquitto_pub', ['-h', '127.0.0.1', '-p', MQTT_PORT, '-V', 'mqttv5',
    '-q', '1', '-t', topic, '-m', message], { timeout: 5000 });
  if (r.status !== 0) throw new Error(`mosquitto_pub exited ${r.status}: ${r.stderr}`);
}

/** True while the process runs (a zombie counts as exited). */
function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch (_) {
    return false;
  }
}

async function shot(page, name) {
  await page.screenshot({ path: path.join(WORK, `dashboard-${name}.png`) });
  if (SHOTS_DIR) {
    mkdirSync(SHOTS_DIR, { recursive: true });
    await page.screenshot({ path: path.join(SHOTS_DIR, `dashboard-${name}.png`) });
  }
}

// A steady trickle of messages on an unrelated topic, so that the rate charts move.
const ticker = spawn('mosquitto_pub', ['-h', '127.0.0.1', '-p', MQTT_PORT, '-V', 'mqttv5',
  '-i', 'dash-ticker', '-q', '1', '-t', 'load/tick', '-l'], { stdio: ['pipe', 'ignore', 'ignore'] });
ticker.on('error', () => {});
ticker.stdin.on('error', () => {});
let tick = 0;
const tickTimer = setInterval(() => {
  const burst = 1 + (tick++ % 7);
  for (let i = 0; i < burst; i++) ticker.stdin.write(`tick ${tick} ${'x'.repeat(40 * burst)}\n`);
}, 100);

const profile = path.join(WORK, 'chromium-profile');
const context = await chromium.launchPersistentContext(profile, {
  executablePath: CHROMIUM,
  headless: true,
  viewport: { width: 1280, height: 800 },
  timeout: 30000,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const page = context.pages()[0] || (await context.newPage());
page.setDefaultTimeout(WAIT);
const pageErrors = [];
page.on('pageerror', (e) => pageErrors.push('pageerror: ' + e.message));
page.on('console', (m) => {
  // The wrong token (401) and the invalid stream (400) are refused on purpose; Chromium logs
  // those fetches. Anything else (a CSP violation: "Refused to ...") is an error.
  const expected = /^Failed to load resource: the server responded with a status of 40[01] /;
  if (m.type() === 'error' && !expected.test(m.text())) pageErrors.push('console: ' + m.text());
});
page.on('dialog', (d) => d.accept());

try {
  await check('the files need no token, /api/v5 still does (401), / has the CSP', async () => {
    const r = await fetch(URL_ + '/');
    if (r.status !== 200) throw new Error(`GET / ${r.status}`);
    const csp = r.headers.get('content-security-policy') || '';
    if (!csp.startsWith("default-src 'self'")) throw new Error(`CSP ${csp}`);
    for (const f of ['app.js', 'style.css', 'vendor/uPlot.iife.min.js', 'vendor/uPlot.min.css']) {
      const a = await fetch(`${URL_}/dashboard/${f}`);
      if (a.status !== 200) throw new Error(`${f}: ${a.status}`);
    }
    const nf = await fetch(URL_ + '/dashboard/nope.js');
    if (nf.status !== 404) throw new Error(`unknown file: ${nf.status}`);
    const api = await fetch(URL_ + '/api/v5/stats');
    if (api.status !== 401) throw new Error(`/api/v5/stats without a token: ${api.status}`);
  });

  await check('without a token the page shows the login', async () => {
    await page.goto(URL_ + '/', { waitUntil: 'load' });
    await page.locator('#login-form').waitFor({ state: 'visible' });
    if (await page.locator('#tabs').isVisible()) throw new Error('tabs visible before login');
  });

  await check('a wrong token shows an error', async () => {
    await page.fill('#token', 'not-the-token');
    await page.click('#login-form button[type=submit]');
    await page.locator('#login-error', { hasText: 'Wrong token' }).waitFor();
    if (!(await page.locator('#login-form').isVisible())) throw new Error('login form gone');
  });

  await check('the right token logs in', async () => {
    await page.fill('#token', TOKEN);
    await page.click('#login-form button[type=submit]');
    await page.locator('#tabs').waitFor({ state: 'visible' });
    await page.locator('#panel-overview').waitFor({ state: 'visible' });
  });

  await check('overview: the chart canvas is drawn and connected clients >= 1', async () => {
    await page.locator('#chart-clients canvas').first().waitFor({ state: 'visible' });
    await page.waitForFunction(() => {
      const v = document.querySelector('#card-clients .value');
      return v && Number(v.textContent.replace(/,/g, '')) >= 1;
    }, null, { timeout: WAIT });
  });

  await check('clients: mosquitto_sub dash-watcher is listed, with its subscription', async () => {
    await page.click('#tab-clients');
    const row = page.locator('#clients-table tbody tr[data-clientid="dash-watcher"]');
    await row.waitFor();
    if (!(await row.innerText()).includes('connected')) throw new Error('not shown connected');
    await row.click();
    await page.locator('#subs-table tbody td', { hasText: 'sensors/#' }).waitFor();
    await shot(page, 'clients');
  });
  // The client search (like_clientid).
  await check('clients: the search box filters by client id', async () => {
    await page.fill('#q-clientid', 'watch');
    await page.click('#client-search button[type=submit]');
    await page.waitForFunction(() => {
      const rows = [...document.querySelectorAll('#clients-table tbody tr[data-clientid]')];
      return rows.length === 1 && rows[0].getAttribute('data-clientid') === 'dash-watcher';
    }, null, { timeout: WAIT });
    await page.fill('#q-clientid', '');
    await page.click('#client-search button[type=submit]');
  });

  await check('streams: a bad stream shows the API message', async () => {
    await page.click('#tab-streams');
    await page.fill('#s-name', '-bad');
    await page.fill('#s-filter', 'a/#/b');
    await page.click('#stream-form button[type=submit]');
    await page.locator('#streams-error', { hasText: 'BAD_REQUEST' }).or(
      page.locator('#streams-error', { hasText: 'invalid stream' })).waitFor();
  });

  await check('streams: create dashtest (sensors/#) through the form', async () => {
    await page.fill('#s-name', 'dashtest');
    await page.fill('#s-filter', 'sensors/#');
    await page.click('#stream-form button[type=submit]');
    await page.locator('#streams-table tbody tr[data-stream="dashtest"]').waitFor();
    if (await page.locator('#streams-error').innerText()) throw new Error('the earlier error is still shown');
  });

  await check('viewer: a message published after creation shows up from earliest', async () => {
    mqttPub('sensors/t1', 'hello-dashboard');
    await page.selectOption('#v-stream', 'dashtest');
    await page.selectOption('#v-from', 'earliest');
    await page.click('#v-start');
    await page.locator('#viewer-table tbody td', { hasText: 'hello-dashboard' }).waitFor({ timeout: 5000 });
  });

  await check('viewer: it follows the stream live', async () => {
    mqttPub('sensors/t2', 'hello-live {"temp": 21.5}');
    await page.locator('#viewer-table tbody td', { hasText: 'hello-live' }).waitFor({ timeout: 5000 });
    await page.locator('#viewer-status', { hasText: 'live' }).waitFor();
    // The list follows: the stream's message count is 2.
    await page.locator('#streams-table tbody tr[data-stream="dashtest"] td.num', { hasText: /^2$/ }).waitFor();
  });

  await check('viewer: a payload with HTML is shown as text, not interpreted', async () => {
    mqttPub('sensors/t3', '<b id="xss">not bold</b><img src=x onerror="window.xss=1">');
    await page.locator('#viewer-table tbody td', { hasText: '<b id="xss">not bold</b>' }).waitFor({ timeout: 5000 });
    if (await page.locator('#xss').count()) throw new Error('the payload became an element');
    if (await page.evaluate(() => window.xss)) throw new Error('the payload ran');
    await shot(page, 'streams');
  });

  await check('lanes: the agents parent, its busiest lanes and the group lag', async () => {
    await page.click('#tab-lanes');
    await page.locator('#parents-table tbody td', { hasText: 'agents/{lane}/#' }).waitFor();
    await page.locator('#lanes-table tbody td', { hasText: 'a1' }).first().waitFor();
    await page.locator('#groups-table tbody td', { hasText: 'workers' }).waitFor();
    await page.locator('#lag-title', { hasText: 'Lag of group workers' }).waitFor();
    await page.locator('#lite-dead_lettered').waitFor();
    await shot(page, 'lanes');
  });

  await check('overview: rates are charted (screenshot)', async () => {
    await page.click('#tab-overview');
    await page.waitForFunction(() => {
      const v = document.querySelector('#card-msg-in .value');
      return v && Number(v.textContent.replace(/,/g, '')) > 0;
    }, null, { timeout: WAIT });
    // For the documentation, let the charts gather some history first.
    await sleep(SHOTS_DIR ? 24000 : 300);
    await shot(page, 'overview');
  });

  await check('clients: Kick disconnects dash-watcher (mosquitto_sub exits, row gone)', async () => {
    await page.click('#tab-clients');
    const kick = page.locator('button[aria-label="Kick dash-watcher"]');
    await kick.click();
    const until = Date.now() + 5000;
    while (WATCHER_PID && alive(WATCHER_PID) && Date.now() < until) await sleep(100);
    if (WATCHER_PID && alive(WATCHER_PID)) throw new Error('mosquitto_sub still running 5 s after the kick');
    await page.locator('#clients-table tbody tr[data-clientid="dash-watcher"]').waitFor({ state: 'detached' });
  });

  await check('streams: delete dashtest through the UI', async () => {
    await page.click('#tab-streams');
    await page.click('button[aria-label="Delete stream dashtest"]');
    await page.locator('#streams-table tbody tr[data-stream="dashtest"]').waitFor({ state: 'detached' });
    const r = await fetch(URL_ + '/api/v5/stream/dashtest', { headers: { Authorization: 'Bearer ' + TOKEN } });
    if (r.status !== 404) throw new Error(`GET /api/v5/stream/dashtest after delete: ${r.status}`);
  });

  await check('a 401 later (token no longer valid) shows the login with a message', async () => {
    await page.evaluate(() => sessionStorage.setItem('lanemq.dashboard.token', 'stale-token'));
    await page.reload({ waitUntil: 'load' });
    await page.locator('#login-error', { hasText: 'refused' }).waitFor();
    await page.fill('#token', TOKEN);
    await page.click('#login-form button[type=submit]');
    await page.locator('#tabs').waitFor({ state: 'visible' });
    await page.click('#logout');
    await page.locator('#login-form').waitFor({ state: 'visible' });
    const kept = await page.evaluate(() => sessionStorage.getItem('lanemq.dashboard.token'));
    if (kept) throw new Error('token still in sessionStorage after logout');
  });

  await check('no script errors and no CSP violations in the page', async () => {
    if (pageErrors.length) throw new Error(pageErrors.join(' | '));
  });
} catch (e) {
  fail('dashboard run', e && e.stack ? e.stack : e);
} finally {
  clearInterval(tickTimer);
  ticker.kill();
  await context.close().catch(() => {});
}
console.log(`dashboard: done, ${failures} failure(s)`);
process.exit(failures ? 1 : 0);
