//! [`FaultSpec`]: the faults a user asked for, parsed from one line of text (`HMC_FAULTS`,
//! the `faults` option, `--faults`) as [`crate::GRAMMAR`] says.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::FaultError;

/// When a fault fires, each time its decision is asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum When {
    /// With this probability (0 to 1), drawn from the spec's seed.
    Chance(f64),
    /// The first N times, then never.
    First(u64),
    /// Every time after the first N.
    After(u64),
}

impl When {
    /// Always.
    pub const ALWAYS: When = When::After(0);
}

/// A delay and when it applies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timed {
    /// How long.
    pub delay: Duration,
    /// When.
    pub when: When,
}

/// A cut transfer: the share of a batch's bytes that lands, and when.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cut {
    /// Strictly between 0 and 1.
    pub fraction: f64,
    /// When.
    pub when: When,
}

/// Where the `notify.*` faults act.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NotifySide {
    /// When a notification is sent (the default).
    #[default]
    Sender,
    /// When a notification is taken by its receiver.
    Receiver,
}

/// The faults to inject, each `None` when off. Parse one from text ([`crate::GRAMMAR`]); an
/// empty text is an empty spec, which injects nothing.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct FaultSpec {
    /// `seed`: every probabilistic decision derives from it.
    pub seed: u64,
    /// `connect.refuse`.
    pub connect_refuse: Option<When>,
    /// `connect.delay`.
    pub connect_delay: Option<Timed>,
    /// `xfer.stall`.
    pub xfer_stall: Option<Timed>,
    /// `xfer.fail`.
    pub xfer_fail: Option<When>,
    /// `xfer.cut`.
    pub xfer_cut: Option<Cut>,
    /// `disconnect.after`.
    pub disconnect_after: Option<u64>,
    /// `restart.after`.
    pub restart_after: Option<u64>,
    /// `notify.drop`.
    pub notify_drop: Option<When>,
    /// `notify.delay`.
    pub notify_delay: Option<Timed>,
    /// `notify.dup`.
    pub notify_dup: Option<When>,
    /// `notify.at`.
    pub notify_at: NotifySide,
    /// `meta.slow`.
    pub meta_slow: Option<Timed>,
    /// `meta.gone`.
    pub meta_gone: Option<When>,
    /// `register.slow`.
    pub register_slow: Option<Timed>,
}

impl FaultSpec {
    /// What `faulty:NAME` injects when neither `HMC_FAULTS` nor a `faults` option gives a
    /// spec: a few percent of the common faults, under seed 1.
    pub const DEFAULT_TEXT: &'static str = "seed=1;connect.refuse=0.05;xfer.stall=100ms@0.05;\
                                            xfer.fail=0.05;notify.drop=0.05";

    /// [`FaultSpec::DEFAULT_TEXT`], parsed.
    pub fn default_faults() -> FaultSpec {
        Self::DEFAULT_TEXT.parse().expect("the default spec parses")
    }

    /// True when no fault is asked for (the seed alone injects nothing).
    pub fn is_empty(&self) -> bool {
        *self
            == FaultSpec {
                seed: self.seed,
                ..FaultSpec::default()
            }
    }
}

fn malformed(token: &str, why: impl Into<String>) -> FaultError {
    FaultError::Malformed {
        token: token.to_string(),
        why: why.into(),
    }
}

fn count(token: &str, v: &str) -> Result<u64, FaultError> {
    v.parse()
        .map_err(|_| malformed(token, "needs a COUNT, a whole number such as 100"))
}

/// A number in `[lo, hi]` (inclusive ends as asked), as a decimal or `N%`.
fn share(token: &str, v: &str, what: &str, open: bool) -> Result<f64, FaultError> {
    let (num, scale) = match v.strip_suffix('%') {
        Some(n) => (n, 100.0),
        None => (v, 1.0),
    };
    let x: f64 = num
        .parse::<f64>()
        .map_err(|_| malformed(token, format!("needs {what}")))?
        / scale;
    let ok = if open {
        x > 0.0 && x < 1.0
    } else {
        (0.0..=1.0).contains(&x)
    };
    if !ok || !x.is_finite() {
        return Err(malformed(token, format!("needs {what}")));
    }
    Ok(x)
}

fn when(token: &str, v: &str) -> Result<When, FaultError> {
    if let Some(n) = v.strip_prefix("first:") {
        return Ok(When::First(count(token, n)?));
    }
    if let Some(n) = v.strip_prefix("after:") {
        return Ok(When::After(count(token, n)?));
    }
    share(
        token,
        v,
        "a WHEN: a probability from 0 to 1 (0.05 or 5%), first:N or after:N",
        false,
    )
    .map(When::Chance)
}

fn duration(token: &str, v: &str) -> Result<Duration, FaultError> {
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &v[digits.len()..];
    let n: u64 = digits.parse().map_err(|_| {
        malformed(
            token,
            "needs a DURATION, a whole number and a unit: 20ms, 500us, 2s",
        )
    })?;
    match unit {
        "us" => Ok(Duration::from_micros(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(malformed(
            token,
            "needs a DURATION with a unit of us, ms or s (20ms, 500us, 2s)",
        )),
    }
}

/// `VALUE[@WHEN]`: the value and its WHEN (always when absent).
fn at(v: &str) -> (&str, Option<&str>) {
    match v.split_once('@') {
        Some((a, b)) => (a, Some(b)),
        None => (v, None),
    }
}

fn timed(token: &str, v: &str) -> Result<Timed, FaultError> {
    let (d, w) = at(v);
    Ok(Timed {
        delay: duration(token, d)?,
        when: w.map_or(Ok(When::ALWAYS), |w| when(token, w))?,
    })
}

impl FromStr for FaultSpec {
    type Err = FaultError;

    fn from_str(s: &str) -> Result<Self, FaultError> {
        let mut spec = FaultSpec::default();
        let mut seen: Vec<&str> = Vec::new();
        for item in s.split(';').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((key, value)) = item.split_once('=') else {
                return Err(malformed(item, "is not KEY=VALUE"));
            };
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(malformed(item, format!("sets `{key}` a second time")));
            }
            seen.push(key);
            match key {
                "seed" => spec.seed = count(item, value)?,
                "connect.refuse" => spec.connect_refuse = Some(when(item, value)?),
                "connect.delay" => spec.connect_delay = Some(timed(item, value)?),
                "xfer.stall" => spec.xfer_stall = Some(timed(item, value)?),
                "xfer.fail" => spec.xfer_fail = Some(when(item, value)?),
                "xfer.cut" => {
                    let (f, w) = at(value);
                    spec.xfer_cut = Some(Cut {
                        fraction: share(
                            item,
                            f,
                            "a FRACTION strictly between 0 and 1 (0.5 or 50%)",
                            true,
                        )?,
                        when: w.map_or(Ok(When::ALWAYS), |w| when(item, w))?,
                    });
                }
                "disconnect.after" => spec.disconnect_after = Some(count(item, value)?),
                "restart.after" => spec.restart_after = Some(count(item, value)?),
                "notify.drop" => spec.notify_drop = Some(when(item, value)?),
                "notify.delay" => spec.notify_delay = Some(timed(item, value)?),
                "notify.dup" => spec.notify_dup = Some(when(item, value)?),
                "notify.at" => {
                    spec.notify_at = match value {
                        "sender" => NotifySide::Sender,
                        "receiver" => NotifySide::Receiver,
                        _ => return Err(malformed(item, "needs sender or receiver")),
                    }
                }
                "meta.slow" => spec.meta_slow = Some(timed(item, value)?),
                "meta.gone" => spec.meta_gone = Some(when(item, value)?),
                "register.slow" => spec.register_slow = Some(timed(item, value)?),
                _ => return Err(malformed(item, format!("has no fault kind `{key}`"))),
            }
        }
        Ok(spec)
    }
}

impl fmt::Display for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            When::Chance(p) => write!(f, "{p}"),
            When::First(n) => write!(f, "first:{n}"),
            When::After(n) => write!(f, "after:{n}"),
        }
    }
}

struct Dur(Duration);

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = self.0.as_micros();
        if us.is_multiple_of(1_000_000) {
            write!(f, "{}s", us / 1_000_000)
        } else if us.is_multiple_of(1000) {
            write!(f, "{}ms", us / 1000)
        } else {
            write!(f, "{us}us")
        }
    }
}

impl fmt::Display for Timed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Dur(self.delay))?;
        if self.when != When::ALWAYS {
            write!(f, "@{}", self.when)?;
        }
        Ok(())
    }
}

impl fmt::Display for FaultSpec {
    /// The canonical text, which parses back to the same spec.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items = vec![format!("seed={}", self.seed)];
        let mut push = |key: &str, v: Option<String>| {
            if let Some(v) = v {
                items.push(format!("{key}={v}"));
            }
        };
        push("connect.refuse", self.connect_refuse.map(|w| w.to_string()));
        push("connect.delay", self.connect_delay.map(|t| t.to_string()));
        push("xfer.stall", self.xfer_stall.map(|t| t.to_string()));
        push("xfer.fail", self.xfer_fail.map(|w| w.to_string()));
        push(
            "xfer.cut",
            self.xfer_cut.map(|c| {
                if c.when == When::ALWAYS {
                    c.fraction.to_string()
                } else {
                    format!("{}@{}", c.fraction, c.when)
                }
            }),
        );
        push(
            "disconnect.after",
            self.disconnect_after.map(|n| n.to_string()),
        );
        push("restart.after", self.restart_after.map(|n| n.to_string()));
        push("notify.drop", self.notify_drop.map(|w| w.to_string()));
        push("notify.delay", self.notify_delay.map(|t| t.to_string()));
        push("notify.dup", self.notify_dup.map(|w| w.to_string()));
        if self.notify_at == NotifySide::Receiver {
            push("notify.at", Some("receiver".into()));
        }
        push("meta.slow", self.meta_slow.map(|t| t.to_string()));
        push("meta.gone", self.meta_gone.map(|w| w.to_string()));
        push("register.slow", self.register_slow.map(|t| t.to_string()));
        f.write_str(&items.join(";"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GRAMMAR;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[rstest::rstest]
    #[case::seed("seed=7", FaultSpec { seed: 7, ..Default::default() })]
    #[case::refuse_chance("connect.refuse=0.5", FaultSpec { connect_refuse: Some(When::Chance(0.5)), ..Default::default() })]
    #[case::refuse_percent("connect.refuse=25%", FaultSpec { connect_refuse: Some(When::Chance(0.25)), ..Default::default() })]
    #[case::refuse_first("connect.refuse=first:2", FaultSpec { connect_refuse: Some(When::First(2)), ..Default::default() })]
    #[case::delay("connect.delay=20ms", FaultSpec { connect_delay: Some(Timed { delay: ms(20), when: When::ALWAYS }), ..Default::default() })]
    #[case::stall("xfer.stall=200ms@0.1", FaultSpec { xfer_stall: Some(Timed { delay: ms(200), when: When::Chance(0.1) }), ..Default::default() })]
    #[case::stall_us("xfer.stall=500us", FaultSpec { xfer_stall: Some(Timed { delay: Duration::from_micros(500), when: When::ALWAYS }), ..Default::default() })]
    #[case::fail("xfer.fail=0.05", FaultSpec { xfer_fail: Some(When::Chance(0.05)), ..Default::default() })]
    #[case::cut("xfer.cut=0.5@after:3", FaultSpec { xfer_cut: Some(Cut { fraction: 0.5, when: When::After(3) }), ..Default::default() })]
    #[case::disconnect("disconnect.after=100", FaultSpec { disconnect_after: Some(100), ..Default::default() })]
    #[case::restart("restart.after=50", FaultSpec { restart_after: Some(50), ..Default::default() })]
    #[case::notify_drop("notify.drop=0.1", FaultSpec { notify_drop: Some(When::Chance(0.1)), ..Default::default() })]
    #[case::notify_delay("notify.delay=2s@0.2", FaultSpec { notify_delay: Some(Timed { delay: ms(2000), when: When::Chance(0.2) }), ..Default::default() })]
    #[case::notify_dup("notify.dup=first:1", FaultSpec { notify_dup: Some(When::First(1)), ..Default::default() })]
    #[case::notify_at("notify.at=receiver", FaultSpec { notify_at: NotifySide::Receiver, ..Default::default() })]
    #[case::meta_slow("meta.slow=100ms", FaultSpec { meta_slow: Some(Timed { delay: ms(100), when: When::ALWAYS }), ..Default::default() })]
    #[case::meta_gone("meta.gone=after:20", FaultSpec { meta_gone: Some(When::After(20)), ..Default::default() })]
    #[case::register_slow("register.slow=10ms", FaultSpec { register_slow: Some(Timed { delay: ms(10), when: When::ALWAYS }), ..Default::default() })]
    #[case::empty("", FaultSpec::default())]
    #[case::spaces_and_empty_items(" seed = 3 ;; xfer.fail = 1 ; ", FaultSpec { seed: 3, xfer_fail: Some(When::Chance(1.0)), ..Default::default() })]
    fn every_token_kind_parses(#[case] text: &str, #[case] want: FaultSpec) {
        let got: FaultSpec = text.parse().unwrap();
        assert_eq!(got, want);
        // The canonical text parses back to the same spec.
        assert_eq!(got.to_string().parse::<FaultSpec>().unwrap(), want, "{got}");
    }

    #[rstest::rstest]
    #[case::no_equals("seed=1;xfer.fail", "xfer.fail", "KEY=VALUE")]
    #[case::unknown_key("xfer.explode=1", "xfer.explode=1", "no fault kind `xfer.explode`")]
    #[case::probability_above_one("xfer.fail=1.5", "xfer.fail=1.5", "probability")]
    #[case::negative("connect.refuse=-0.1", "connect.refuse=-0.1", "probability")]
    #[case::percent_above("notify.drop=150%", "notify.drop=150%", "probability")]
    #[case::no_unit("xfer.stall=200", "xfer.stall=200", "unit of us, ms or s")]
    #[case::bad_unit("meta.slow=3h", "meta.slow=3h", "unit of us, ms or s")]
    #[case::bad_when("connect.delay=20ms@often", "connect.delay=20ms@often", "WHEN")]
    #[case::cut_whole("xfer.cut=1", "xfer.cut=1", "strictly between 0 and 1")]
    #[case::cut_zero("xfer.cut=0@0.5", "xfer.cut=0@0.5", "strictly between 0 and 1")]
    #[case::count("disconnect.after=ten", "disconnect.after=ten", "COUNT")]
    #[case::first_count("meta.gone=first:x", "meta.gone=first:x", "COUNT")]
    #[case::seed_count("seed=-1", "seed=-1", "COUNT")]
    #[case::side("notify.at=both", "notify.at=both", "sender or receiver")]
    #[case::twice("xfer.fail=0.1;xfer.fail=0.2", "xfer.fail=0.2", "second time")]
    fn a_malformed_spec_names_the_token_and_prints_the_grammar(
        #[case] text: &str,
        #[case] token: &str,
        #[case] why: &str,
    ) {
        let e = text.parse::<FaultSpec>().unwrap_err().to_string();
        assert!(e.contains(&format!("`{token}`")), "{e}");
        assert!(e.contains(why), "{e}");
        assert!(e.contains(GRAMMAR), "{e}");
    }

    #[test]
    fn the_default_spec_parses_and_an_empty_one_is_empty() {
        assert!(!FaultSpec::default_faults().is_empty());
        assert!("seed=9".parse::<FaultSpec>().unwrap().is_empty());
        assert!(!"register.slow=1ms".parse::<FaultSpec>().unwrap().is_empty());
        // The grammar's own example parses.
        let example = GRAMMAR.rsplit("example: ").next().unwrap();
        example.parse::<FaultSpec>().unwrap();
    }
}
