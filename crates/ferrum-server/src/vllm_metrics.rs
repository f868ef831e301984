//! `/metrics` under vLLM's names as well as Ferrum's own.
//!
//! Routers and gateways pick replicas from a model server's Prometheus
//! metrics by vLLM's names: the Gateway API Inference Extension's
//! model-server protocol reads `vllm:num_requests_waiting`,
//! `vllm:num_requests_running` and `vllm:kv_cache_usage_perc`; llm-d,
//! vllm-router, KEDA/HPA rules and the usual Grafana dashboards read the
//! rest. The engine records under `ferrum_*` names only (it knows nothing
//! of the server or vLLM); [`Mirror`], in front of the Prometheus recorder,
//! records each metric vLLM also has a second time under vLLM's name, type,
//! buckets and labels (`model_name`, `engine`). Histograms under vLLM's
//! names are real histograms with vLLM's buckets (dashboards take
//! `histogram_quantile` of their `_bucket`s); Ferrum's own stay summaries.
//!
//! `vllm:lora_requests_info` waits for LoRA adapters.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Label, Metadata,
    Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

/// What a metric is, for its `# HELP` line.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram(&'static [f64]),
}

/// One of vLLM's metrics and the engine's metric it mirrors.
struct Alias {
    ferrum: &'static str,
    vllm: &'static str,
    kind: Kind,
    help: &'static str,
}

/// vLLM's time-to-first-token buckets (seconds).
const TTFT: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's per-token latency buckets (seconds).
const PER_TOKEN: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request latency buckets (seconds).
const REQUEST: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
/// Token counts: vLLM's 1-2-5 series, which stops at the model's length;
/// the length is not known when the recorder is built, so the series runs
/// to a million (buckets past the length stay equal to `+Inf`).
const TOKENS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5,
    5e5, 1e6,
];

const ALIASES: &[Alias] = &[
    Alias {
        ferrum: "ferrum_requests_running",
        vllm: "vllm:num_requests_running",
        kind: Kind::Gauge,
        help: "Number of requests in model execution batches.",
    },
    Alias {
        ferrum: "ferrum_requests_waiting",
        vllm: "vllm:num_requests_waiting",
        kind: Kind::Gauge,
        help: "Number of requests waiting to be processed.",
    },
    Alias {
        ferrum: "ferrum_kv_cache_usage",
        vllm: "vllm:kv_cache_usage_perc",
        kind: Kind::Gauge,
        help: "KV-cache usage. 1 means 100 percent usage.",
    },
    // The name vLLM used before 0.9, which the Gateway API Inference
    // Extension's first model-server protocol reads.
    Alias {
        ferrum: "ferrum_kv_cache_usage",
        vllm: "vllm:gpu_cache_usage_perc",
        kind: Kind::Gauge,
        help:
            "KV-cache usage. 1 means 100 percent usage. Deprecated: use vllm:kv_cache_usage_perc.",
    },
    Alias {
        ferrum: "ferrum_prefix_cache_queries_total",
        vllm: "vllm:prefix_cache_queries_total",
        kind: Kind::Counter,
        help: "Prefix cache queries, in terms of number of queried tokens.",
    },
    Alias {
        ferrum: "ferrum_prefix_cache_hits_total",
        vllm: "vllm:prefix_cache_hits_total",
        kind: Kind::Counter,
        help: "Prefix cache hits, in terms of number of cached tokens.",
    },
    Alias {
        ferrum: "ferrum_preemptions_total",
        vllm: "vllm:num_preemptions_total",
        kind: Kind::Counter,
        help: "Cumulative number of preemptions from the engine.",
    },
    Alias {
        ferrum: "ferrum_prompt_tokens_total",
        vllm: "vllm:prompt_tokens_total",
        kind: Kind::Counter,
        help: "Number of prefill tokens processed.",
    },
    Alias {
        ferrum: "ferrum_generation_tokens_total",
        vllm: "vllm:generation_tokens_total",
        kind: Kind::Counter,
        help: "Number of generation tokens processed.",
    },
    Alias {
        ferrum: "ferrum_requests_finished_total",
        vllm: "vllm:request_success_total",
        kind: Kind::Counter,
        help: "Count of successfully processed requests.",
    },
    Alias {
        ferrum: "ferrum_time_to_first_token_seconds",
        vllm: "vllm:time_to_first_token_seconds",
        kind: Kind::Histogram(TTFT),
        help: "Histogram of time to first token in seconds.",
    },
    Alias {
        ferrum: "ferrum_inter_token_latency_seconds",
        vllm: "vllm:inter_token_latency_seconds",
        kind: Kind::Histogram(PER_TOKEN),
        help: "Histogram of inter-token latency in seconds.",
    },
    Alias {
        ferrum: "ferrum_time_per_output_token_seconds",
        vllm: "vllm:request_time_per_output_token_seconds",
        kind: Kind::Histogram(PER_TOKEN),
        help: "Histogram of time_per_output_token_seconds per request.",
    },
    Alias {
        ferrum: "ferrum_e2e_request_latency_seconds",
        vllm: "vllm:e2e_request_latency_seconds",
        kind: Kind::Histogram(REQUEST),
        help: "Histogram of e2e request latency in seconds.",
    },
    Alias {
        ferrum: "ferrum_request_prompt_tokens",
        vllm: "vllm:request_prompt_tokens",
        kind: Kind::Histogram(TOKENS),
        help: "Number of prefill tokens processed.",
    },
    Alias {
        ferrum: "ferrum_request_generation_tokens",
        vllm: "vllm:request_generation_tokens",
        kind: Kind::Histogram(TOKENS),
        help: "Number of generation tokens processed.",
    },
];

/// vLLM's names for the engine's metric `name`.
fn aliases(name: &str) -> impl Iterator<Item = &'static Alias> + '_ {
    ALIASES.iter().filter(move |a| a.ferrum == name)
}

/// Installs the process's metrics recorder: Prometheus, with vLLM's names
/// mirrored, labelled with `model_name` (the served model name). Fails if
/// a recorder is already installed.
pub fn install(model_name: &str) -> Result<PrometheusHandle, String> {
    let mut builder = PrometheusBuilder::new();
    for a in ALIASES {
        if let Kind::Histogram(buckets) = a.kind {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(a.vllm.to_string()), buckets)
                .map_err(|e| format!("cannot set up metrics: {e}"))?;
        }
    }
    let inner = builder.build_recorder();
    for a in ALIASES {
        let (name, help) = (KeyName::from(a.vllm), SharedString::from(a.help));
        match a.kind {
            Kind::Counter => inner.describe_counter(name, None, help),
            Kind::Gauge => inner.describe_gauge(name, None, help),
            Kind::Histogram(_) => inner.describe_histogram(name, None, help),
        }
    }
    let handle = inner.handle();
    let labels = vec![
        Label::new("model_name", model_name.to_string()),
        Label::new("engine", "0"),
    ];
    metrics::set_global_recorder(Mirror::new(inner, labels))
        .map_err(|e| format!("cannot set up metrics: {e}"))?;
    Ok(handle)
}

/// Drains recorded histogram samples into their buckets every few seconds.
/// Without it samples pile up between scrapes, without bound where nothing
/// scrapes `/metrics` (one per generated token).
pub fn spawn_upkeep(handle: PrometheusHandle) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });
}

/// The Prometheus recorder, recording each aliased metric twice.
struct Mirror {
    inner: PrometheusRecorder,
    /// `model_name` and `engine`, added to vLLM's names only.
    labels: Vec<Label>,
    /// The mirrored handles made so far. `counter!` and its kin register
    /// at every call (once per generated token for some), and a mirrored
    /// handle costs allocations to make: it is made once per key.
    counters: Handles<Counter>,
    gauges: Handles<Gauge>,
    histograms: Handles<Histogram>,
}

type Handles<T> = RwLock<HashMap<Key, T>>;

impl Mirror {
    fn new(inner: PrometheusRecorder, labels: Vec<Label>) -> Self {
        Self {
            inner,
            labels,
            counters: RwLock::default(),
            gauges: RwLock::default(),
            histograms: RwLock::default(),
        }
    }

    /// `key`'s handle from `register`, recording under vLLM's names too
    /// where it has any (made once, then taken from `made`).
    fn mirror<T: Clone>(
        &self,
        key: &Key,
        made: &Handles<T>,
        register: impl Fn(&Key) -> T,
        many: impl FnOnce(Many<T>) -> T,
    ) -> T {
        if aliases(key.name()).next().is_none() {
            return register(key);
        }
        if let Some(h) = made.read().ok().and_then(|m| m.get(key).cloned()) {
            return h;
        }
        let own = register(key);
        let vllm = aliases(key.name()).map(|a| register(&self.vllm_key(a, key)));
        let handle = many(Many(std::iter::once(own).chain(vllm).collect()));
        if let Ok(mut m) = made.write() {
            m.insert(key.clone(), handle.clone());
        }
        handle
    }

    /// The vLLM key for `key`: its labels plus `model_name` and `engine`.
    fn vllm_key(&self, a: &Alias, key: &Key) -> Key {
        let labels = key.labels().cloned().chain(self.labels.iter().cloned());
        Key::from_parts(a.vllm, labels.collect::<Vec<_>>())
    }
}

/// A metric recorded under several names: the engine's, then vLLM's.
struct Many<T>(Vec<T>);

impl CounterFn for Many<Counter> {
    fn increment(&self, value: u64) {
        self.0.iter().for_each(|c| c.increment(value));
    }

    fn absolute(&self, value: u64) {
        self.0.iter().for_each(|c| c.absolute(value));
    }
}

impl GaugeFn for Many<Gauge> {
    fn increment(&self, value: f64) {
        self.0.iter().for_each(|g| g.increment(value));
    }

    fn decrement(&self, value: f64) {
        self.0.iter().for_each(|g| g.decrement(value));
    }

    fn set(&self, value: f64) {
        self.0.iter().for_each(|g| g.set(value));
    }
}

impl HistogramFn for Many<Histogram> {
    fn record(&self, value: f64) {
        self.0.iter().for_each(|h| h.record(value));
    }
}

impl Recorder for Mirror {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.mirror(
            key,
            &self.counters,
            |k| self.inner.register_counter(k, metadata),
            |m| Counter::from_arc(Arc::new(m)),
        )
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.mirror(
            key,
            &self.gauges,
            |k| self.inner.register_gauge(k, metadata),
            |m| Gauge::from_arc(Arc::new(m)),
        )
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.mirror(
            key,
            &self.histograms,
            |k| self.inner.register_histogram(k, metadata),
            |m| Histogram::from_arc(Arc::new(m)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alias mirrors a name the engine records, under vLLM's prefix,
    /// and counters end in `_total` as Prometheus renders vLLM's.
    #[test]
    fn aliases_are_well_formed() {
        for a in ALIASES {
            assert!(
                a.ferrum.starts_with("ferrum_") && a.vllm.starts_with("vllm:"),
                "{}",
                a.vllm
            );
            if matches!(a.kind, Kind::Counter) {
                assert!(
                    a.vllm.ends_with("_total") && a.ferrum.ends_with("_total"),
                    "{}",
                    a.vllm
                );
            }
            if let Kind::Histogram(b) = a.kind {
                assert!(b.windows(2).all(|w| w[0] < w[1]), "{} buckets", a.vllm);
            }
        }
    }

    /// A mirrored histogram renders under both names: Ferrum's as a
    /// summary, vLLM's as a histogram with vLLM's buckets and labels.
    #[test]
    fn mirror_records_both_names() {
        let mut builder = PrometheusBuilder::new();
        builder = builder
            .set_buckets_for_metric(
                Matcher::Full("vllm:time_to_first_token_seconds".into()),
                TTFT,
            )
            .unwrap();
        let inner = builder.build_recorder();
        let handle = inner.handle();
        let labels = vec![Label::new("model_name", "m"), Label::new("engine", "0")];
        let mirror = Mirror::new(inner, labels);
        metrics::with_local_recorder(&mirror, || {
            metrics::histogram!("ferrum_time_to_first_token_seconds").record(0.03);
            metrics::counter!("ferrum_requests_finished_total", "finished_reason" => "stop")
                .increment(2);
            metrics::gauge!("ferrum_kv_blocks_used").set(3.0);
        });
        let text = handle.render();
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"0.04\"} 1"
        ));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"0.02\"} 0"
        ));
        assert!(text.contains("ferrum_time_to_first_token_seconds{quantile=\"0.5\"}"));
        assert!(text.contains(
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"m\",engine=\"0\"} 2"
        ));
        assert!(text.contains("ferrum_requests_finished_total{finished_reason=\"stop\"} 2"));
        assert!(text.contains("ferrum_kv_blocks_used 3"));
        metrics::with_local_recorder(&mirror, || {
            metrics::gauge!("ferrum_kv_cache_usage").set(0.25);
            // A second call takes the handle made by the first.
            metrics::counter!("ferrum_requests_finished_total", "finished_reason" => "stop")
                .increment(1);
        });
        assert_eq!(mirror.counters.read().unwrap().len(), 1);
        let text = handle.render();
        assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.25"));
        assert!(text.contains("vllm:gpu_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.25"));
        assert!(text.contains(
            "vllm:request_success_total{finished_reason=\"stop\",model_name=\"m\",engine=\"0\"} 3"
        ));
        assert!(text.contains("ferrum_requests_finished_total{finished_reason=\"stop\"} 3"));
        assert!(!text.contains("vllm:kv_blocks"));
    }
}
