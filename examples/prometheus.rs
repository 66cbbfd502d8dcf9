//! prometheus: an application's metrics and readiness, served the way operators consume them.
//!
//! kstate reports through the `metrics` facade (the series are listed in docs/runtime.md,
//! "Metrics and health"); any recorder can take them. Here a Prometheus recorder renders them
//! at `/metrics`, and `/health` answers an orchestrator's readiness probe from
//! `Running::readiness`: `200` once every task runs, `503` while the group has not assigned
//! this process yet or any task is still restoring (its inputs paused), with the reason as the
//! body. The application counts records per key and sends every count to `--output`.
//!
//! ```text
//! KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 cargo run --release --example prometheus -- \
//!     --application-id counter --input events --output counts [--listen 127.0.0.1:9464]
//! curl -s 127.0.0.1:9464/health; curl -s 127.0.0.1:9464/metrics
//! ```
//!
//! It prints `prometheus: listening on http://<address>` once serving (`--listen
//! 127.0.0.1:0` picks a free port), and stops on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Parser;
use kstate::{App, BoxError, Context, Processor, Record, Running, StoreHandle, StoreOptions};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// A count per key with its metrics at /metrics and its readiness at /health.
#[derive(Parser)]
struct Args {
    /// The application id: the consumer group, and the prefix of the changelog topics.
    #[arg(long)]
    application_id: String,
    /// The brokers.
    #[arg(
        long,
        env = "KAFKA_BOOTSTRAP_SERVERS",
        default_value = "127.0.0.1:9092"
    )]
    bootstrap_servers: String,
    /// Where the tasks' stores live (default: the runtime's, under the system's temporary
    /// directory).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// The input topic.
    #[arg(long)]
    input: String,
    /// The output topic: each key's count, as decimal text, for every input record.
    #[arg(long)]
    output: String,
    /// The address to serve /metrics and /health on.
    #[arg(long, default_value = "127.0.0.1:9464")]
    listen: SocketAddr,
}

/// Counts records per key, and sends each new count to the output topic.
struct CountByKey {
    counts: StoreHandle<Vec<u8>, u64>,
    output: String,
}

impl Processor for CountByKey {
    fn process(&mut self, ctx: &mut Context<'_>, record: &Record<'_>) -> Result<(), BoxError> {
        let key = record.key.unwrap_or_default().to_vec();
        let counts = ctx.store(&self.counts);
        let count = counts.get(&key)?.unwrap_or(0) + 1;
        counts.put(&key, &count)?;
        ctx.send(&self.output, &key, Some(count.to_string().as_bytes()))?;
        Ok(())
    }
}

/// What the HTTP handlers read.
#[derive(Clone)]
struct Served {
    metrics: PrometheusHandle,
    running: Arc<Running>,
}

async fn render_metrics(State(served): State<Served>) -> String {
    served.metrics.render()
}

async fn readiness_probe(State(served): State<Served>) -> (StatusCode, String) {
    let readiness = served.running.readiness();
    let status = match readiness.is_ready() {
        true => StatusCode::OK,
        false => StatusCode::SERVICE_UNAVAILABLE,
    };
    (status, format!("{readiness}\n"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    // The runtime's story (restores, assignments, commits) and its warnings, to stderr.
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .init();
    // Installed before the application starts, so that no series is missed.
    let metrics = PrometheusBuilder::new().install_recorder()?;

    let mut builder = App::builder(args.application_id, args.bootstrap_servers);
    builder.input(args.input);
    if let Some(dir) = args.state_dir {
        builder.state_dir(dir);
    }
    let counts = builder.store::<Vec<u8>, u64>("counts", StoreOptions::default());
    let output = args.output;
    let app = builder.build(move |_task| {
        Box::new(CountByKey {
            counts: counts.clone(),
            output: output.clone(),
        })
    })?;
    let running = Arc::new(app.start()?);

    let router = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/health", get(readiness_probe))
        .with_state(Served {
            metrics,
            running: running.clone(),
        });
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!("prometheus: listening on http://{}", listener.local_addr()?);

    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            eprintln!("prometheus: the HTTP server stopped: {error}");
        }
    });
    // Until SIGTERM or SIGINT: then the workers commit and close, off the runtime.
    running.run_until_signal().await?;
    eprintln!("prometheus: stopped");
    Ok(())
}
