//! The sampler against direct computations of what each setting means.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use ferrum_engine::{Sampler, SamplingParams};

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: Some(7),
        ..SamplingParams::default()
    }
}

fn softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = x.iter().map(|&v| (v as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// Frequencies of `n` draws.
fn histogram(p: SamplingParams, logits: &[f32], n: usize) -> Vec<f64> {
    let mut s = Sampler::new(p, &[]);
    let mut h = vec![0f64; logits.len()];
    for _ in 0..n {
        h[s.sample(&mut logits.to_vec()).token as usize] += 1.0;
    }
    h.iter().map(|c| c / n as f64).collect()
}

#[test]
fn greedy_takes_the_argmax_and_reports_logprobs() {
    let logits = vec![0.5, 3.0, -1.0, 2.9];
    let mut s = Sampler::new(
        SamplingParams {
            top_logprobs: 3,
            ..SamplingParams::greedy()
        },
        &[],
    );
    let out = s.sample(&mut logits.clone());
    assert_eq!(out.token, 1);
    let lp: Vec<f64> = softmax(&logits).iter().map(|p| p.ln()).collect();
    assert!((out.logprob as f64 - lp[1]).abs() < 1e-6);
    let ids: Vec<u32> = out.top.iter().map(|t| t.0).collect();
    assert_eq!(ids, vec![1, 3, 0]);
    assert!((out.top[1].1 as f64 - lp[3]).abs() < 1e-6);
}

#[test]
fn temperature_one_samples_the_softmax() {
    let logits = vec![1.0, 2.0, 0.0, 1.5];
    let want = softmax(&logits);
    let got = histogram(params(1.0), &logits, 40_000);
    for i in 0..4 {
        // 40k draws: standard error < 0.0025, allow 4 sigma.
        assert!(
            (got[i] - want[i]).abs() < 0.01,
            "token {i}: {} vs {}",
            got[i],
            want[i]
        );
    }
    // Temperature 0.5 sharpens: probabilities of logits / 0.5.
    let sharp: Vec<f32> = logits.iter().map(|l| l * 2.0).collect();
    let want = softmax(&sharp);
    let got = histogram(params(0.5), &logits, 40_000);
    for i in 0..4 {
        assert!((got[i] - want[i]).abs() < 0.01, "T=0.5 token {i}");
    }
}

#[test]
fn truncations_keep_only_allowed_tokens() {
    let logits = vec![2.0, 1.9, 0.0, -3.0, 1.0];
    let p = softmax(&logits);
    // top_k = 2: only tokens 0 and 1, renormalised.
    let got = histogram(SamplingParams { top_k: 2, ..params(1.0) }, &logits, 20_000);
    assert_eq!(got[2] + got[3] + got[4], 0.0);
    let want0 = p[0] / (p[0] + p[1]);
    assert!((got[0] - want0).abs() < 0.015);
    // top_p = 0.5: token 0 alone has p[0] < 0.5, tokens 0 and 1 exceed it.
    assert!(p[0] < 0.5 && p[0] + p[1] >= 0.5);
    let got = histogram(SamplingParams { top_p: 0.5, ..params(1.0) }, &logits, 5_000);
    assert_eq!(got[2] + got[3] + got[4], 0.0);
    assert!(got[1] > 0.0);
    // min_p = 0.3: keeps tokens with p >= 0.3 · p_max (tokens 0, 1, 4).
    let keep: Vec<bool> = p.iter().map(|&x| x >= 0.3 * p[0]).collect();
    assert_eq!(keep, vec![true, true, false, false, true]);
    let got = histogram(SamplingParams { min_p: 0.3, ..params(1.0) }, &logits, 5_000);
    assert_eq!(got[2] + got[3], 0.0);
    assert!(got[4] > 0.0);
}

#[test]
fn seeds_make_sampling_reproducible() {
    let logits: Vec<f32> = (0..1000)
        .map(|i| ((i * 7919) % 1000) as f32 / 300.0)
        .collect();
    let run = |seed| {
        let mut s = Sampler::new(
            SamplingParams {
                seed: Some(seed),
                ..SamplingParams::default()
            },
            &[],
        );
        (0..50)
            .map(|_| s.sample(&mut logits.clone()).token)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn penalties_change_logits_as_documented() {
    let p = SamplingParams {
        repetition_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        top_logprobs: 4,
        ..SamplingParams::greedy()
    };
    // Prompt has token 0; output so far: token 1 twice.
    let mut s = Sampler::new(p, &[0]);
    s.accept(1);
    s.accept(1);
    let mut logits = vec![4.0, -1.0, 3.0, 0.0];
    s.sample(&mut logits);
    // 0: 4 / 2 = 2; 1: -1 · 2 - 0.5 - 0.25 · 2 = -3; others unchanged.
    assert_eq!(logits, vec![2.0, -3.0, 3.0, 0.0]);
}

#[test]
fn invalid_settings_are_named() {
    let cases = [
        (
            SamplingParams { temperature: -1.0, ..Default::default() },
            "temperature",
        ),
        (SamplingParams { top_p: 1.5, ..Default::default() }, "top_p"),
        (SamplingParams { top_p: 0.0, ..Default::default() }, "top_p"),
        (
            SamplingParams { min_p: -0.1, ..Default::default() },
            "min_p",
        ),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                presence_penalty: 3.0,
                ..Default::default()
            },
            "presence_penalty",
        ),
        (
            SamplingParams { top_logprobs: 21, ..Default::default() },
            "top_logprobs",
        ),
    ];
    for (p, field) in cases {
        let err = p.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
    assert!(SamplingParams::default().validate().is_ok());
}

/// Speculative verification with a point-mass draft must emit tokens with
/// exactly the distribution `sample` draws from, whatever the draft, and
/// accept the draft with probability p(draft).
#[test]
fn verifying_a_draft_keeps_the_sampling_distribution() {
    let logits = vec![1.0, 2.0, 0.0, 1.5, -0.5];
    let n = 40_000;
    for settings in [params(1.0), SamplingParams { top_k: 3, ..params(0.7) }] {
        let want = histogram(settings.clone(), &logits, 200_000);
        for draft in 0..logits.len() as u32 {
            let mut s = Sampler::new(settings.clone(), &[]);
            let mut h = vec![0f64; logits.len()];
            let mut accepted = 0usize;
            for _ in 0..n {
                let (out, acc) = s.verify(&mut logits.clone(), draft);
                assert_eq!(acc, out.token == draft);
                accepted += usize::from(acc);
                h[out.token as usize] += 1.0 / n as f64;
            }
            for i in 0..logits.len() {
                // 40k draws: standard error < 0.0025; 4 sigma.
                assert!(
                    (h[i] - want[i]).abs() < 0.01,
                    "draft {draft}, token {i}: {} vs {} ({settings:?})",
                    h[i],
                    want[i]
                );
            }
            let rate = accepted as f64 / n as f64;
            assert!(
                (rate - want[draft as usize]).abs() < 0.01,
                "acceptance of {draft}"
            );
        }
    }
    // Greedy: accepted exactly when the draft is the argmax.
    let mut s = Sampler::new(SamplingParams::greedy(), &[]);
    assert_eq!(s.verify(&mut logits.clone(), 1).0.token, 1);
    assert!(s.verify(&mut logits.clone(), 1).1);
    let (out, acc) = s.verify(&mut logits.clone(), 3);
    assert_eq!((out.token, acc), (1, false));
}

#[test]
fn logit_bias_shifts_logits_before_sampling() {
    let logits = [0.5f32, 3.0, -1.0, 2.9];
    // Greedy: +100 forces token 2; -100 on the argmax hands it to token 3.
    let biased = |bias: Vec<(u32, f32)>, temperature: f32| SamplingParams {
        logit_bias: bias,
        ..params(temperature)
    };
    let mut s = Sampler::new(biased(vec![(2, 100.0)], 0.0), &[]);
    assert_eq!(s.sample(&mut logits.to_vec()).token, 2);
    let mut s = Sampler::new(biased(vec![(1, -100.0)], 0.0), &[]);
    assert_eq!(s.sample(&mut logits.to_vec()).token, 3);
    // Sampling draws from softmax(logits + bias), and the reported
    // log-probabilities are of the biased logits.
    let bias = vec![(0, 2.0), (3, -1.5)];
    let want = softmax(&[2.5, 3.0, -1.0, 1.4]);
    let h = histogram(biased(bias.clone(), 1.0), &logits, 40_000);
    for (got, want) in h.iter().zip(&want) {
        assert!((got - want).abs() < 0.01, "{h:?} vs {want:?}");
    }
    let mut s = Sampler::new(biased(bias, 0.0), &[]);
    let got = s.sample(&mut logits.to_vec());
    assert_eq!(got.token, 1);
    assert!((got.logprob as f64 - want[1].ln()).abs() < 1e-5);
    // Out of range is refused.
    assert!(biased(vec![(0, 100.5)], 1.0).validate().is_err());
    assert!(biased(vec![(0, f32::NAN)], 1.0).validate().is_err());
}

/// Top logprobs are the `n` best by a full sort (ties: lower id first), and
/// what a token's result keeps is those `n`, not a vocabulary-sized buffer:
/// with logprobs on, every generated token keeps one (a 150k vocabulary
/// kept 1.2 MB per token before).
#[test]
fn top_logprobs_keep_only_the_top_entries() {
    let vocab = 150_000;
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0)
        .collect();
    for n in [1, 5, 20] {
        let mut p = params(0.0);
        p.top_logprobs = n;
        let s = Sampler::new(p, &[]).sample(&mut logits.clone());
        assert!(
            s.top.capacity() <= n,
            "capacity {} for {n}",
            s.top.capacity()
        );
        let mut want: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        want.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let got: Vec<u32> = s.top.iter().map(|t| t.0).collect();
        let want: Vec<u32> = want[..n].iter().map(|t| t.0).collect();
        assert_eq!(got, want, "top {n}");
    }
}

/// A grammar's mask sets banned logits to -inf: those tokens are not
/// alternatives (their -inf would reach clients as `"logprob": null`), and
/// the sampled token's log-probability is over the allowed ones.
#[test]
fn masked_tokens_are_not_alternatives() {
    let inf = f32::NEG_INFINITY;
    let logits = vec![inf, 1.0, inf, 0.0, inf];
    for t in [0.0, 1.0] {
        let mut p = params(t);
        p.top_logprobs = 5;
        let s = Sampler::new(p, &[]).sample(&mut logits.clone());
        assert!([1, 3].contains(&s.token));
        let ids: Vec<u32> = s.top.iter().map(|e| e.0).collect();
        assert_eq!(ids, vec![1, 3], "temperature {t}");
        let lp = softmax(&logits)[s.token as usize].ln();
        assert!((s.logprob as f64 - lp).abs() < 1e-6);
        assert!(s.top.iter().all(|e| e.1.is_finite()));
    }
}
