// MQTT.js (the npm package `mqtt`, the client of web and Node users) against a running broker:
// node scenarios.mjs PORT [NAME...]. One line per scenario, "PASS: name" or "FAIL: name -- why";
// exit status = the number of failures. Every wait is bounded.
import mqtt from "mqtt";
import crypto from "node:crypto";

const PORT = Number(process.argv[2]);
// Users for the SCRAM scenario, "METHOD:user:password,..." (set by interop/mqttjs.sh).
const SCRAM_USERS = (process.env.SCRAM_USERS || "").split(",").filter(Boolean).map((u) => u.split(":"));
const only = process.argv.slice(3);
const URL = `mqtt://127.0.0.1:${PORT}`;
let failures = 0;
let n = 0;

function connect(opts = {}) {
  return new Promise((resolve, reject) => {
    const c = mqtt.connect(URL, { reconnectPeriod: 0, connectTimeout: 5000, ...opts });
    const t = setTimeout(() => reject(new Error("no CONNACK within 5 s")), 5000);
    c.once("connect", (ack) => { clearTimeout(t); c.connack = ack; resolve(c); });
    c.once("error", (e) => { clearTimeout(t); reject(e); });
  });
}
const sub = (c, topic, opts) => c.subscribeAsync(topic, opts);
const pub = (c, topic, msg, opts) => c.publishAsync(topic, msg, opts);
const end = (c) => c.endAsync();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Collect messages on `c` until `want` arrived or `ms` passed.
function collect(c, want, ms = 5000) {
  return new Promise((resolve) => {
    const got = [];
    const t = setTimeout(() => { c.removeListener("message", on); resolve(got); }, ms);
    function on(topic, payload, packet) {
      got.push({ topic, payload: payload.toString(), packet });
      if (got.length >= want) { clearTimeout(t); c.removeListener("message", on); resolve(got); }
    }
    c.on("message", on);
  });
}
const uid = () => Math.random().toString(36).slice(2, 8);
// A SCRAM client (RFC 5802) written here with node:crypto, independently of the broker's:
// start() gives the client-first-message, final(serverFirst) the client-final-message, and
// verify(serverFinal) checks the server's signature.
function scramClient(method, user, password) {
  const hash = method === "SCRAM-SHA-512" ? "sha512" : "sha256";
  const len = hash === "sha512" ? 64 : 32;
  const hmac = (key, data) => crypto.createHmac(hash, key).update(data).digest();
  const name = user.replace(/=/g, "=3D").replace(/,/g, "=2C");
  const cnonce = crypto.randomBytes(18).toString("base64");
  const bare = `n=${name},r=${cnonce}`;
  let serverSignature;
  return {
    first: () => Buffer.from(`n,,${bare}`),
    final(serverFirst) {
      const attrs = Object.fromEntries(serverFirst.split(",").map((a) => [a[0], a.slice(2)]));
      if (!attrs.r.startsWith(cnonce) || attrs.r === cnonce) throw new Error("server nonce does not extend ours");
      const salted = crypto.pbkdf2Sync(password, Buffer.from(attrs.s, "base64"), Number(attrs.i), len, hash);
      const clientKey = hmac(salted, "Client Key");
      const storedKey = crypto.createHash(hash).update(clientKey).digest();
      const withoutProof = `c=${Buffer.from("n,,").toString("base64")},r=${attrs.r}`;
      const authMessage = `${bare},${serverFirst},${withoutProof}`;
      const sig = hmac(storedKey, authMessage);
      const proof = Buffer.from(clientKey.map((b, i) => b ^ sig[i]));
      serverSignature = hmac(hmac(salted, "Server Key"), authMessage);
      return Buffer.from(`${withoutProof},p=${proof.toString("base64")}`);
    },
    verify(serverFinal) {
      const v = Buffer.from(String(serverFinal).replace(/^v=/, ""), "base64");
      return serverSignature !== undefined && v.length === serverSignature.length &&
        crypto.timingSafeEqual(v, serverSignature);
    },
  };
}

// Connect with MQTT 5 enhanced authentication: the AUTH exchange runs in MQTT.js's
// handleAuth hook, as an application would write it.
async function scramConnect(method, user, password, extra = {}) {
  let scram = scramClient(method, user, password);
  const c = mqtt.connect(URL, {
    reconnectPeriod: 0, connectTimeout: 5000, protocolVersion: 5, manualConnect: true,
    clientId: `js-scram-${uid()}`,
    properties: { authenticationMethod: method, authenticationData: scram.first() }, ...extra,
  });
  c.handleAuth = (packet, cb) => {
    const data = packet.properties?.authenticationData?.toString();
    if (packet.reasonCode === 0x18) {
      try {
        cb(null, { cmd: "auth", reasonCode: 0x18, properties: { authenticationMethod: method, authenticationData: scram.final(data) } });
      } catch (e) { cb(e); }
    } else {
      c.reauthOk = scram.verify(data);
      cb();
    }
  };
  c.reauthenticate = () => {
    scram = scramClient(method, user, password);
    c.reauthOk = undefined;
    c._sendPacket({ cmd: "auth", reasonCode: 0x19, properties: { authenticationMethod: method, authenticationData: scram.first() } });
  };
  const done = new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error("no CONNACK within 5 s")), 5000);
    c.once("connect", (ack) => {
      clearTimeout(t);
      c.serverVerified = scram.verify(ack.properties?.authenticationData?.toString());
      resolve(c);
    });
    c.once("error", (e) => { clearTimeout(t); c.end(true); reject(e); });
  });
  c.connect();
  return done;
}

function check(cond, why) { if (!cond) throw new Error(why); }

const scenarios = {
  // MQTT 5 and 3.1.1 connect; QoS 0, 1 and 2 both ways, in order per QoS.
  async qos_0_1_2(v) {
    for (const protocolVersion of [5, 4]) {
      const t = `js/qos/${protocolVersion}/${uid()}`;
      const s = await connect({ protocolVersion, clientId: `js-s-${uid()}` });
      const p = await connect({ protocolVersion, clientId: `js-p-${uid()}` });
      check(s.connack.sessionPresent === false, "session present on a clean start");
      const granted = await sub(s, t, { qos: 2 });
      check(granted[0].qos === 2, `granted ${JSON.stringify(granted)}`);
      const wait = collect(s, 9);
      for (let i = 0; i < 9; i++) await pub(p, t, `m${i}`, { qos: i % 3 });
      const got = await wait;
      check(got.length === 9, `v${protocolVersion}: ${got.length} of 9 arrived`);
      check(got.every((m) => m.packet.qos === Number(m.payload.slice(1)) % 3),
        `v${protocolVersion}: QoS: ${got.map((m) => `${m.payload}@${m.packet.qos}`)}`);
      // Order holds per QoS (MQTT 5 4.6: "for the same Topic and QoS"); a QoS 0 message may
      // pass a QoS 2 one published just before it (QoS 0 is routed at once, QoS 1/2 once
      // stored), as seen once in CI.
      for (const q of [0, 1, 2]) {
        const seq = got.filter((m) => m.packet.qos === q).map((m) => Number(m.payload.slice(1)));
        check(seq.every((x, i) => i === 0 || x > seq[i - 1]), `v${protocolVersion}: QoS ${q} out of order: ${seq}`);
      }
      await end(s); await end(p);
    }
  },
  // A retained message reaches a later subscriber with RETAIN set; an empty one clears it.
  async retained() {
    const t = `js/ret/${uid()}`;
    const p = await connect({ protocolVersion: 5 });
    await pub(p, t, "kept", { qos: 1, retain: true });
    const s = await connect({ protocolVersion: 5 });
    const wait = collect(s, 1);
    await sub(s, t, { qos: 1 });
    const got = await wait;
    check(got.length === 1 && got[0].payload === "kept" && got[0].packet.retain, "retained not delivered with RETAIN");
    await pub(p, t, "", { qos: 1, retain: true });
    const s2 = await connect({ protocolVersion: 5 });
    const wait2 = collect(s2, 1, 600);
    await sub(s2, t, { qos: 1 });
    check((await wait2).length === 0, "a cleared retained message was delivered");
    await end(s); await end(s2); await end(p);
  },
  // A client that vanishes without DISCONNECT: its will is published (with a delay of 1 s).
  async will() {
    const t = `js/will/${uid()}`;
    const w = await connect({ protocolVersion: 5 });
    await sub(w, t, { qos: 1 });
    const dying = await connect({
      protocolVersion: 5,
      properties: { sessionExpiryInterval: 10 },
      will: { topic: t, payload: Buffer.from("gone"), qos: 1, properties: { willDelayInterval: 1 } },
    });
    const wait = collect(w, 1, 4000);
    const t0 = Date.now();
    dying.stream.destroy(); // no DISCONNECT
    const got = await wait;
    check(got.length === 1 && got[0].payload === "gone", "no will");
    check(Date.now() - t0 >= 900, `will after ${Date.now() - t0} ms, before its 1 s delay`);
    dying.end(true);
    await end(w);
  },
  // `$stream/events` with the user property stream-offset=earliest replays history in order,
  // each message carrying its stream offset, then goes live.
  async stream_replay() {
    const tag = uid();
    const p = await connect({ protocolVersion: 5 });
    for (let i = 0; i < 5; i++) await pub(p, `ev/${tag}`, `h${i}`, { qos: 1 });
    const r = await connect({ protocolVersion: 5 });
    const wait = collect(r, 1000, 1500);
    await sub(r, "$stream/events", { qos: 1, properties: { userProperties: { "stream-offset": "earliest" } } });
    const hist = (await wait).filter((m) => m.packet.topic === `ev/${tag}`);
    check(hist.length === 5 && hist.every((m, i) => m.payload === `h${i}`),
      `history: ${hist.map((m) => m.payload)}`);
    const offs = hist.map((m) => m.packet.properties?.userProperties?.["stream-offset"]);
    check(offs.every((o) => typeof o === "string" && o.startsWith("@")), `stream-offset properties: ${offs}`);
    const nums = offs.map((o) => Number(o.slice(1)));
    check(nums.every((x, i) => i === 0 || x > nums[i - 1]), `offsets not increasing: ${offs}`);
    const live = collect(r, 1, 3000);
    await pub(p, `ev/${tag}`, "live", { qos: 1 });
    const l = await live;
    check(l.length === 1 && l[0].payload === "live", "the live message did not follow the history");
    await end(r); await end(p);
  },
  // A lane group of two: `$share/js/agents/+/#`; 10 lanes x 5 messages; each message to one
  // member exactly once, each lane in order (lane-offset 0..4), both members get lanes.
  async lane_group_of_two() {
    const tag = uid();
    const members = [];
    const got = [];
    for (let i = 0; i < 2; i++) {
      const m = await connect({ protocolVersion: 5, clientId: `js-lane-${i}-${tag}` });
      m.on("message", (topic, payload, packet) => got.push({ i, topic, payload: payload.toString(), packet }));
      const g = await sub(m, "$share/js/agents/+/#", { qos: 1 });
      check(g[0].qos === 1, `lane group granted ${JSON.stringify(g)}`);
      members.push(m);
    }
    const p = await connect({ protocolVersion: 5 });
    for (let s = 0; s < 5; s++) for (let l = 0; l < 10; l++) await pub(p, `agents/${tag}-${l}/x`, `${l}:${s}`, { qos: 1 });
    for (let k = 0; k < 50 && got.length < 50; k++) await sleep(100);
    await sleep(300);
    check(got.length === 50, `${got.length} of 50 delivered`);
    const lanes = new Map();
    for (const d of got) {
      const [l, s] = d.payload.split(":").map(Number);
      if (!lanes.has(l)) lanes.set(l, []);
      lanes.get(l).push({ s, off: d.packet.properties?.userProperties?.["lane-offset"], i: d.i });
    }
    for (const [l, ds] of lanes) {
      check(ds.map((d) => d.s).join() === "0,1,2,3,4", `lane ${l} out of order: ${ds.map((d) => d.s)}`);
      check(ds.map((d) => d.off).join() === "0,1,2,3,4", `lane ${l} lane-offset: ${ds.map((d) => d.off)}`);
    }
    const per = [0, 1].map((i) => got.filter((d) => d.i === i).length);
    check(per[0] > 0 && per[1] > 0, `one member got everything: ${per}`);
    for (const m of members) await end(m);
    await end(p);
  },
  // MQTT 5 enhanced authentication (AUTH packets): SCRAM-SHA-512 over a $7$ entry (one written
  // by the real mosquitto_passwd when it is installed) and SCRAM-SHA-256; the client checks
  // the server-final-message; a wrong password gets CONNACK 0x86; a re-authentication
  // (AUTH 0x19) on the live connection succeeds and traffic goes on.
  async scram() {
    check(SCRAM_USERS.length > 0, "SCRAM_USERS is not set");
    for (const [method, user, password] of SCRAM_USERS) {
      const c = await scramConnect(method, user, password);
      check(c.serverVerified === true, `${method} ${user}: server-final-message did not verify`);
      const t = `js/scram/${uid()}`;
      await sub(c, t, { qos: 1 });
      const wait = collect(c, 2);
      await pub(c, t, "before", { qos: 1 });
      c.reauthenticate();
      await pub(c, t, "during", { qos: 1 });
      const got = await wait;
      check(got.map((m) => m.payload).join() === "before,during", `${method}: got ${got.map((m) => m.payload)}`);
      for (let i = 0; i < 50 && c.reauthOk === undefined; i++) await sleep(20);
      check(c.reauthOk === true, `${method} ${user}: re-authentication did not complete with a verified AUTH 0x00`);
      check(c.connected, `${method}: disconnected after re-authentication`);
      await end(c);
      let refused;
      try {
        const bad = await scramConnect(method, user, `${password}-wrong`);
        await end(bad);
      } catch (e) { refused = e; }
      check(refused?.code === 0x86, `${method}: wrong password: ${refused ? `code ${refused.code}` : "accepted"}`);
    }
  },
};

for (const [name, f] of Object.entries(scenarios)) {
  if (only.length && !only.some((o) => name.includes(o))) continue;
  n += 1;
  const t0 = Date.now();
  try {
    await Promise.race([f(), sleep(30000).then(() => { throw new Error("timed out after 30 s"); })]);
    console.log(`PASS: ${name} (${((Date.now() - t0) / 1000).toFixed(1)}s)`);
  } catch (e) {
    failures += 1;
    console.log(`FAIL: ${name} -- ${e.message}`);
  }
}
console.log(`mqttjs: ${n - failures} passed, ${failures} failed`);
process.exit(failures);
