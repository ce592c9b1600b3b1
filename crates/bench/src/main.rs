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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(lanemq_bench::run(cli.opts))?;
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
    if report.timed_out || (report.mode == "throughput" && report.published == 0) {
        std::process::exit(2);
    }
    Ok(())
}
