//! `mooring bench`: the benchmark's flags turned into its config, and its report printed.

use mooring::config::parse_size;
use mooring::ops::bench::{self, BenchConfig, MasterPlacement};
use mooring_core::{Error, ErrorCode};

use super::args::BenchArgs;
use super::usage_error;

pub(crate) async fn run_bench(args: BenchArgs) -> Result<(), Error> {
    let sizes = args
        .sizes
        .iter()
        .map(|s| parse_size(s))
        .collect::<Result<Vec<u64>, String>>()
        .map_err(usage_error)?;
    let master = match (args.master, args.embedded.as_deref()) {
        (Some(addr), _) => MasterPlacement::Remote(addr),
        (None, None | Some("process")) => MasterPlacement::Process,
        (None, Some("writer")) => MasterPlacement::InWriter,
        (None, Some(other)) => {
            return Err(usage_error(format!(
                "--embedded takes `process` or `writer`, not {other:?}"
            )));
        }
    };
    let config = BenchConfig {
        master,
        sizes,
        count: args.count,
        batch: args.batch,
        progress: !args.json,
        transport: args.transport,
        readers: args.readers,
        clients: args.clients,
        peer: args.peer,
    };
    let report = bench::run(
        &config,
        std::env::current_exe().map_err(|e| {
            Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("cannot find this executable: {e}"),
            )
        })?,
    )
    .await?;
    if args.json {
        out!("{}", report.to_json());
    } else {
        out!("{}", report.to_table().trim_end());
    }
    Ok(())
}
