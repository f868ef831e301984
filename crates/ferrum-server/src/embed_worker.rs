//! The thread that owns the embedding model. Requests that arrive while a
//! pass is running are merged into the next pass (up to [`MAX_INPUTS`]
//! inputs), so concurrent clients share GEMMs instead of queueing.

use ferrum_engine::{Embedder, Embedding, Prepared};
use ferrum_types::Result;
use tokio::sync::{mpsc, oneshot};

/// Inputs merged into one call at most.
pub const MAX_INPUTS: usize = 256;

pub struct EmbedJob {
    pub inputs: Vec<Prepared>,
    pub reply: oneshot::Sender<Result<Vec<Embedding>>>,
}

pub fn spawn(
    embedder: std::sync::Arc<Embedder>,
) -> std::io::Result<mpsc::UnboundedSender<EmbedJob>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<EmbedJob>();
    std::thread::Builder::new()
        .name("ferrum-embed".into())
        .spawn(move || {
            let serve = move || {
                while let Some(first) = rx.blocking_recv() {
                    let mut jobs = vec![first];
                    let mut count = jobs[0].inputs.len();
                    while count < MAX_INPUTS {
                        match rx.try_recv() {
                            Ok(j) => {
                                count += j.inputs.len();
                                jobs.push(j);
                            }
                            Err(_) => break,
                        }
                    }
                    let all: Vec<Prepared> =
                        jobs.iter().flat_map(|j| j.inputs.iter().cloned()).collect();
                    metrics::histogram!("ferrum_embedding_batch_inputs").record(all.len() as f64);
                    match embedder.embed_prepared(&all) {
                        Ok(mut vectors) => {
                            for j in jobs {
                                let rest = vectors.split_off(j.inputs.len());
                                let _ = j.reply.send(Ok(vectors));
                                vectors = rest;
                            }
                        }
                        Err(e) => {
                            let msg = e.to_string();
                            for j in jobs {
                                let _ = j
                                    .reply
                                    .send(Err(ferrum_types::FerrumError::Device(msg.clone())));
                            }
                        }
                    }
                }
            };
            if let Err(e) = ferrum_kernels::cpu::on_pool(None, serve) {
                tracing::error!("cannot start the embedding model's CPU threads: {e}");
            }
        })?;
    Ok(tx)
}
