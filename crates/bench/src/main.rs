//! `lanemq-bench`: MQTT load generator. See `--help`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "lanemq-bench",
    version,
    about = "MQTT 3.1.1/5 load generator and latency meter"
)]
struct Cli {
    #[command(flatten)]
    opts: lanemq_bench::BenchOpts,
}

fn main() {
    let cli = Cli::parse();
    let report = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(lanemq_bench::run(cli.opts)));
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lanemq-bench: {e:#}");
            std::process::exit(1);
        }
    };
    // With --json - the JSON owns stdout; the summary goes to stderr.
    if report
        .opts
        .json
        .as_deref()
        .is_some_and(|p| p.as_os_str() == "-")
    {
        eprint!("{report}");
    } else {
        print!("{report}");
    }
    // 2 = ran but the result is not usable (hard timeout, nothing published).
    if report.timed_out
        || ((report.mode == "throughput" || report.mode.starts_with("lanes"))
            && report.published == 0)
    {
        std::process::exit(2);
    }
}
