//! Dequantization of every supported GGUF type against the `gguf` Python
//! package's numpy dequantizer, on blocks of real model tensors where the
//! fetched models have the type and random blocks otherwise
//! (`tests/fixtures/dequant.json`, written by `scripts/make_dequant_fixtures.py`).

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use base64::Engine;
use ferrum_kernels::quant::{can_dequantize, dequantize};
use ferrum_types::GgmlType;

#[test]
fn every_type_matches_the_gguf_reference() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/dequant.json")).unwrap();
    let types = fixture["types"].as_object().unwrap();
    let mut checked = 0;
    for ty in GgmlType::all().filter(|&t| can_dequantize(t)) {
        let entry = &types[&ty.to_string()];
        assert!(entry.is_object(), "fixture has no {ty}");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(entry["bytes_b64"].as_str().unwrap())
            .unwrap();
        let want: Vec<f32> = entry["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let mut got = vec![f32::NAN; want.len()];
        dequantize(ty, &raw, &mut got).unwrap();
        let scale = want.iter().fold(0f32, |a, &v| a.max(v.abs()));
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            // Both sides compute `d·sc·q - dmin·m` in f32; operation order may
            // differ by one rounding, so allow 2 ulp of the block's magnitude.
            assert!(
                (g - w).abs() <= 2.0 * f32::EPSILON * scale,
                "{ty} value {i}: got {g}, reference {w} ({})",
                entry["source"]
            );
        }
        checked += 1;
    }
    assert_eq!(
        checked, 17,
        "F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q8_K IQ4_NL IQ4_XS MXFP4"
    );
}

#[test]
fn wrong_sizes_and_unsupported_types_are_errors() {
    let mut out = vec![0f32; 256];
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 33], &mut out[..32]).is_err());
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 34], &mut out[..31]).is_err());
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 34], &mut out[..32]).is_ok());
    let err = dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut out[..256]).unwrap_err();
    assert!(err.is_unsupported(), "{err}");
}
