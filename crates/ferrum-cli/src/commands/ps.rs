//! `ferrum ps`: what a running `ferrum serve` has loaded (as `ollama ps`),
//! read from its `/api/ps`, `/health` and `/metrics`.

use anyhow::{bail, Result};
use clap::Args;
use serde_json::Value;

use super::human_bytes;

#[derive(Args)]
pub struct PsArgs {
    /// The server's address.
    #[arg(long, env = "FERRUM_URL", default_value = "http://127.0.0.1:8000")]
    url: String,
    /// The server's API key, when it was started with one.
    #[arg(long, env = "FERRUM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Print the server's /api/ps answer as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn ps(args: PsArgs) -> Result<()> {
    let base = args.url.trim_end_matches('/');
    let get = |path: &str| -> Result<ureq::Response> {
        let mut req = ureq::get(&format!("{base}{path}"));
        if let Some(k) = &args.api_key {
            req = req.set("Authorization", &format!("Bearer {k}"));
        }
        match req.call() {
            Ok(r) => Ok(r),
            // /health answers 503 while the model loads.
            Err(ureq::Error::Status(503, r)) if path == "/health" => Ok(r),
            Err(ureq::Error::Status(401, _)) => {
                bail!("the server at {base} needs an API key: give --api-key (or FERRUM_API_KEY)")
            }
            Err(ureq::Error::Status(code, _)) => {
                bail!("{base}{path} answered {code}: is this a Ferrum server?")
            }
            Err(_) => bail!(
                "no server answers at {base}: start one with `ferrum serve`, or give its address with --url"
            ),
        }
    };
    let health: Value = get("/health")?.into_json().unwrap_or(Value::Null);
    let ps: Value = get("/api/ps")?.into_json()?;
    if args.json {
        println!("{ps}");
        return Ok(());
    }
    // Requests in flight; /metrics may be closed to this key, which is
    // not worth failing over.
    let in_flight = get("/metrics")
        .ok()
        .and_then(|r| r.into_string().ok())
        .and_then(|m| gauge(&m, "ferrum_requests_pending"));
    print!("{}", table(&ps, health["status"].as_str(), in_flight));
    Ok(())
}

/// A Prometheus gauge's value from a scrape.
fn gauge(scrape: &str, name: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The table `ps` prints: one row per loaded model, or a line saying the
/// model is still loading.
fn table(ps: &Value, status: Option<&str>, in_flight: Option<f64>) -> String {
    let models = ps["models"].as_array().map_or(&[][..], Vec::as_slice);
    if models.is_empty() {
        return match status {
            Some("loading") => "the server is loading its model\n".into(),
            _ => "no model loaded\n".into(),
        };
    }
    let rows: Vec<[String; 6]> = models
        .iter()
        .map(|m| {
            let d = &m["details"];
            let text = |v: &Value| v.as_str().unwrap_or("-").to_string();
            [
                text(&m["name"]),
                text(&d["format"]),
                text(&d["quantization_level"]),
                m["size"].as_u64().map_or("-".into(), human_bytes),
                m["context_length"]
                    .as_u64()
                    .map_or("-".into(), |c| c.to_string()),
                in_flight.map_or("-".into(), |n| format!("{n:.0}")),
            ]
        })
        .collect();
    let head = ["NAME", "FORMAT", "QUANT", "SIZE", "CONTEXT", "REQUESTS"].map(String::from);
    let widths: Vec<usize> = (0..6)
        .map(|i| {
            rows.iter()
                .chain([&head])
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |r: &[String; 6]| {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", cells.join("  ").trim_end())
    };
    std::iter::once(&head).chain(&rows).map(line).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_loaded_model_is_one_row_and_a_loading_one_says_so() {
        let ps = json!({"models": [{"name": "smollm2:latest", "size": 98_100_000,
            "context_length": 4096,
            "details": {"format": "gguf", "quantization_level": "Q4_1"}}]});
        assert_eq!(
            table(&ps, Some("ok"), Some(2.0)),
            "NAME            FORMAT  QUANT  SIZE     CONTEXT  REQUESTS\n\
             smollm2:latest  gguf    Q4_1   98.1 MB  4096     2\n"
        );
        let none = json!({"models": []});
        assert_eq!(
            table(&none, Some("loading"), None),
            "the server is loading its model\n"
        );
        assert_eq!(table(&none, Some("ok"), None), "no model loaded\n");
    }

    #[test]
    fn gauges_are_read_from_a_scrape() {
        let scrape = "# TYPE ferrum_requests_pending gauge\nferrum_requests_pending 3\nferrum_requests_pending_x 9\n";
        assert_eq!(gauge(scrape, "ferrum_requests_pending"), Some(3.0));
        assert_eq!(gauge(scrape, "ferrum_model_ready"), None);
    }
}
