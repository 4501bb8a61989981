//! Token choice: greedy, temperature and top-p, checked against probabilities computed
//! here from the softmax formula.

use burn_mapped_models::qwen2::{Sampler, Sampling, SamplingError, argmax};

fn top_p(temperature: f64, top_p: f64, seed: u64) -> Sampler {
    Sampler::new(Sampling::TopP {
        temperature,
        top_p,
        seed,
    })
    .unwrap()
}

/// Deterministic pseudo-random logits for tests (an LCG, independent of the sampler's).
fn logits(n: usize, salt: u64) -> Vec<f32> {
    let mut s = salt
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect()
}

#[test]
fn greedy_picks_the_largest_logit() {
    let row = [0.5, -1.0, 3.25, 3.0, -7.0];
    assert_eq!(Sampler::greedy().sample(&row).unwrap(), 2);
    assert_eq!(argmax(&row).unwrap(), 2);
    for salt in 0..20 {
        let row = logits(1000, salt);
        let expected = (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        assert_eq!(Sampler::greedy().sample(&row).unwrap(), expected);
    }
}

#[test]
fn greedy_breaks_ties_toward_the_lowest_id() {
    assert_eq!(argmax(&[1.0, 4.0, 2.0, 4.0]).unwrap(), 1);
}

#[test]
fn top_p_near_zero_is_greedy() {
    for salt in 0..50 {
        let row = logits(500, salt);
        let greedy = argmax(&row).unwrap();
        let mut sampler = top_p(1.3, 1e-9, salt);
        for _ in 0..5 {
            assert_eq!(sampler.sample(&row).unwrap(), greedy);
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_tokens() {
    let row = logits(300, 7);
    let draw = |seed| {
        let mut s = top_p(0.8, 0.95, seed);
        (0..64).map(|_| s.sample(&row).unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(draw(42), draw(42));
    assert_ne!(draw(42), draw(43));
}

/// Frequencies over many draws against `softmax(logits / T)`, computed here.
fn assert_frequencies(sampler: &mut Sampler, row: &[f32], expected: &[f64], draws: usize) {
    let mut counts = vec![0usize; row.len()];
    for _ in 0..draws {
        counts[sampler.sample(row).unwrap() as usize] += 1;
    }
    for (i, (&c, &p)) in counts.iter().zip(expected).enumerate() {
        let f = c as f64 / draws as f64;
        // Five standard deviations of a binomial proportion; the seed is fixed, so this
        // is a sanity bound, not a flaky statistical test.
        let tol = 5.0 * (p * (1.0 - p) / draws as f64).sqrt() + 1e-12;
        assert!(
            (f - p).abs() <= tol,
            "token {i}: frequency {f:.4}, expected {p:.4} ± {tol:.4}"
        );
    }
}

fn softmax(row: &[f32], temperature: f64) -> Vec<f64> {
    let e: Vec<f64> = row
        .iter()
        .map(|&l| (l as f64 / temperature).exp())
        .collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Logits whose softmax is 0.1, 0.2, 0.3, 0.4.
fn logits_of_tenths() -> Vec<f32> {
    [1.0f64, 2.0, 3.0, 4.0]
        .iter()
        .map(|p| p.ln() as f32)
        .collect()
}

#[test]
fn temperature_sampling_follows_the_softmax() {
    let row = logits_of_tenths();
    // T = 1: probabilities 0.1, 0.2, 0.3, 0.4.
    assert_frequencies(&mut top_p(1.0, 1.0, 1), &row, &softmax(&row, 1.0), 40_000);
    // T = 2 flattens: proportional to sqrt(1..4).
    assert_frequencies(&mut top_p(2.0, 1.0, 2), &row, &softmax(&row, 2.0), 40_000);
    // T = 0.5 sharpens: proportional to (1..4)^2.
    assert_frequencies(&mut top_p(0.5, 1.0, 3), &row, &softmax(&row, 0.5), 40_000);
}

#[test]
fn top_p_keeps_the_smallest_nucleus_and_renormalizes() {
    let row = logits_of_tenths();
    // Sorted probabilities 0.4, 0.3, ...: 0.4 < 0.5 <= 0.7, so ids 3 and 2 remain,
    // renormalized to 4/7 and 3/7.
    let expected = [0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0];
    assert_frequencies(&mut top_p(1.0, 0.5, 9), &row, &expected, 40_000);
    // p = 0.35 is reached by id 3 (0.4) alone.
    let mut s = top_p(1.0, 0.35, 9);
    assert!((0..1000).all(|_| s.sample(&row).unwrap() == 3));
}

#[test]
fn rejects_invalid_parameters() {
    let bad = |temperature, top_p| {
        Sampler::new(Sampling::TopP {
            temperature,
            top_p,
            seed: 0,
        })
        .unwrap_err()
    };
    assert_eq!(bad(0.0, 0.9), SamplingError::InvalidTemperature(0.0));
    assert_eq!(bad(-1.0, 0.9), SamplingError::InvalidTemperature(-1.0));
    assert!(matches!(
        bad(f64::NAN, 0.9),
        SamplingError::InvalidTemperature(_)
    ));
    assert_eq!(bad(1.0, 0.0), SamplingError::InvalidTopP(0.0));
    assert_eq!(bad(1.0, 1.5), SamplingError::InvalidTopP(1.5));
    assert!(matches!(bad(1.0, f64::NAN), SamplingError::InvalidTopP(_)));
}

#[test]
fn rejects_empty_and_non_finite_logits() {
    assert_eq!(
        Sampler::greedy().sample(&[]).unwrap_err(),
        SamplingError::EmptyLogits
    );
    let err = top_p(1.0, 0.9, 0).sample(&[0.0, f32::NAN]).unwrap_err();
    assert!(matches!(
        err,
        SamplingError::NonFiniteLogit { index: 1, .. }
    ));
    assert!(matches!(
        argmax(&[f32::INFINITY]).unwrap_err(),
        SamplingError::NonFiniteLogit { index: 0, .. }
    ));
}
