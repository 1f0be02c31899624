//! `mooring debug`: misbehaving on purpose, to test the cluster's answers (a put started and
//! never finished).

use std::io::Write;
use std::time::Duration;

use mooring::client_id_for;
use mooring_core::{Error, ReplicateConfig};

use super::args::{DebugAction, DebugArgs};

pub(crate) async fn run_debug(args: DebugArgs) -> Result<(), Error> {
    match args.action {
        DebugAction::HangPut { master, key, size } => {
            let token = mooring::token::resolve(None)?;
            let client = client_id_for(token.as_ref());
            let control = mooring::client::connect::control_plane(
                &master,
                Duration::from_secs(10),
                token,
                client,
            )?;
            let control: &dyn mooring_proto::transport::ControlPlane = &*control;
            let reply = control
                .call(mooring_proto::wire::PutStart {
                    client,
                    key: key.clone(),
                    size,
                    config: ReplicateConfig::single(),
                    upsert: false,
                })
                .await?;
            out!("started put of {key}: {reply:?}");
            let _ = std::io::stdout().flush();
            std::future::pending::<()>().await;
            Ok(())
        }
    }
}
