//! The demo service's vocabulary: method ids and the typed request and response of
//! `complex` (the handlers are registered by `hmc_rpc::demo::register_demo`).

use serde::{Deserialize, Serialize};

/// Method id of `echo`: returns the request bytes.
pub const ECHO: u32 = 1;
/// Method id of `uppercase`: an [`RpcCodec`](crate::codec::RpcCodec) `String` in, upper-cased out.
pub const UPPERCASE: u32 = 2;
/// Method id of `complex`: a [`ComplexRequest`] in, a [`ComplexResponse`] out.
pub const COMPLEX: u32 = 3;

/// The composite request of `complex`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComplexRequest {
    /// Any text.
    pub label: String,
    /// Integers to summarise.
    pub values: Vec<i64>,
}

/// The typed result of `complex`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComplexResponse {
    /// The label, upper-cased.
    pub label: String,
    /// Number of values.
    pub count: u32,
    /// Their sum (saturating).
    pub sum: i64,
    /// Smallest value, if any.
    pub min: Option<i64>,
    /// Largest value, if any.
    pub max: Option<i64>,
    /// Their mean, if any.
    pub mean: Option<f64>,
}

impl ComplexResponse {
    /// What `complex` computes.
    pub fn compute(req: &ComplexRequest) -> Self {
        let v = &req.values;
        ComplexResponse {
            label: req.label.to_uppercase(),
            count: v.len() as u32,
            sum: v.iter().fold(0i64, |a, b| a.saturating_add(*b)),
            min: v.iter().copied().min(),
            max: v.iter().copied().max(),
            mean: (!v.is_empty())
                .then(|| v.iter().map(|x| *x as f64).sum::<f64>() / v.len() as f64),
        }
    }
}

impl std::fmt::Display for ComplexResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let opt = |o: Option<i64>| o.map_or("-".to_string(), |v| v.to_string());
        write!(
            f,
            "label={} count={} sum={} min={} max={} mean={}",
            self.label,
            self.count,
            self.sum,
            opt(self.min),
            opt(self.max),
            self.mean.map_or("-".to_string(), |m| format!("{m:.3}"))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complex_summarises_values() {
        let r = ComplexResponse::compute(&ComplexRequest {
            label: "typed payload".into(),
            values: vec![3, 5, 8],
        });
        assert_eq!(
            r.to_string(),
            "label=TYPED PAYLOAD count=3 sum=16 min=3 max=8 mean=5.333"
        );
        let e = ComplexResponse::compute(&ComplexRequest {
            label: String::new(),
            values: vec![],
        });
        assert_eq!(e.to_string(), "label= count=0 sum=0 min=- max=- mean=-");
    }
}
