//! The prefix cache's changes published as vLLM's KV-cache events
//! (`--kv-events-endpoint`), for routers that place each request on the
//! replica that already holds its prefix (NVIDIA Dynamo, llm-d's precise
//! prefix scorer, vllm-router's `kv_aware` policy).
//!
//! The wire format is vLLM's (`vllm/distributed/kv_events.py`): a ZeroMQ
//! PUB socket sends each engine step's changes as one three-frame message,
//! `[topic, sequence number (8 bytes, big-endian), payload]`, the payload
//! msgspec's msgpack of vLLM's structs: the batch array-like, `[ts, events,
//! data_parallel_rank]`, each event a map tagged with its class name under
//! `"type"`: `BlockStored` (`block_hashes`, `parent_block_hash`,
//! `token_ids`, `block_size`, `lora_id`, `medium`, `lora_name`),
//! `BlockRemoved` (`block_hashes`, `medium`), `AllBlocksCleared`. (vLLM
//! releases before 0.11 wrote events as arrays too; vllm-router decodes
//! this layout and refuses that one.) Block hashes are the cache's own 64-bit chain hashes
//! (a block's hash covers its tokens and every token before it); `medium`
//! is null, the server's one KV tier, which vLLM names after its device.
//!
//! As in vLLM, an endpoint with a wildcard host (`tcp://*:5557`) is bound
//! and any other is connected to. vLLM's replay socket (missed batches on
//! request) is not served: a subscriber that joins late starts from the
//! next batch.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use ferrum_engine::{KvEvent, KvEventBatch};
use serde::Serialize;
use tokio::sync::mpsc::UnboundedReceiver;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

/// One event as vLLM's msgspec struct: a map of its fields, tagged with
/// its class name under `"type"`.
#[derive(Serialize)]
#[serde(tag = "type")]
enum Event<'a> {
    BlockStored {
        block_hashes: &'a [u64],
        parent_block_hash: Option<u64>,
        token_ids: &'a [u32],
        block_size: usize,
        lora_id: Option<u32>,
        medium: Option<&'static str>,
        lora_name: Option<&'static str>,
    },
    BlockRemoved {
        block_hashes: &'a [u64],
        medium: Option<&'static str>,
    },
    AllBlocksCleared {},
}

/// One step's changes as vLLM's msgpack payload: the batch array-like,
/// `[ts, events, data_parallel_rank]`, its events maps.
pub fn encode(batch: &KvEventBatch, ts: f64) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    let events: Vec<Event> = batch
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored { hashes, parent, tokens } => Event::BlockStored {
                block_hashes: hashes,
                parent_block_hash: *parent,
                token_ids: tokens,
                block_size: batch.block_size,
                lora_id: None,
                medium: None,
                lora_name: None,
            },
            KvEvent::Removed { hashes } => {
                Event::BlockRemoved { block_hashes: hashes, medium: None }
            }
            KvEvent::AllCleared => Event::AllBlocksCleared {},
        })
        .collect();
    let mut out = Vec::new();
    (ts, events, 0u32).serialize(&mut rmp_serde::Serializer::new(&mut out).with_struct_map())?;
    Ok(out)
}

/// Opens the PUB socket on `endpoint`: bound where its host is a wildcard
/// (`*`, `0.0.0.0`, `::`), connected otherwise. Fails when the endpoint is
/// malformed or cannot be bound.
pub async fn open(endpoint: &str) -> Result<PubSocket, String> {
    let mut socket = PubSocket::new();
    let wildcard =
        endpoint.contains("://*:") || endpoint.contains("0.0.0.0") || endpoint.contains("::");
    let done = if wildcard {
        socket
            .bind(&endpoint.replace("://*:", "://0.0.0.0:"))
            .await
            .map(drop)
    } else {
        socket.connect(endpoint).await
    };
    done.map_err(|e| format!("cannot open --kv-events-endpoint {endpoint}: {e}"))?;
    Ok(socket)
}

/// Publishes every batch the engine sends, numbered from 0, until the
/// engine ends.
pub async fn publish(
    mut socket: PubSocket,
    topic: String,
    mut rx: UnboundedReceiver<KvEventBatch>,
) {
    let mut seq: u64 = 0;
    while let Some(batch) = rx.recv().await {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let payload = match encode(&batch, ts) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("cannot encode KV events: {e}");
                continue;
            }
        };
        let frames = vec![
            Bytes::from(topic.clone().into_bytes()),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ];
        seq += 1;
        let Ok(message) = ZmqMessage::try_from(frames) else {
            continue;
        };
        // A PUB socket drops what no subscriber takes; an error is a
        // connection gone, which the next batch does not depend on.
        if let Err(e) = socket.send(message).await {
            tracing::debug!("KV events not sent: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payload is vLLM's: `[ts, events, rank]`, each event a map
    /// tagged by `type`.
    #[test]
    fn payload_is_vllms_msgpack_shape() {
        let batch = KvEventBatch {
            block_size: 2,
            events: vec![
                KvEvent::Stored {
                    hashes: vec![7, 9],
                    parent: None,
                    tokens: vec![1, 2, 3, 4],
                },
                KvEvent::Removed { hashes: vec![u64::MAX] },
                KvEvent::AllCleared,
            ],
        };
        let bytes = encode(&batch, 1.5).unwrap();
        let v: serde_json::Value = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                1.5,
                [
                    {"type": "BlockStored", "block_hashes": [7, 9], "parent_block_hash": null,
                     "token_ids": [1, 2, 3, 4], "block_size": 2, "lora_id": null, "medium": null,
                     "lora_name": null},
                    {"type": "BlockRemoved", "block_hashes": [u64::MAX], "medium": null},
                    {"type": "AllBlocksCleared"},
                ],
                0,
            ])
        );
    }
}
