//! Fault injection says it is on, once per process: the first plan logs one warn line
//! with its spec, and later plans log nothing more. (Its own test binary: the
//! announcement is once per process.)

use std::io::Write;
use std::sync::{Arc, Mutex};

use hmc_faults::FaultPlan;

/// A writer into a shared buffer, for the subscriber.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_first_plan_warns_once_naming_its_spec() {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        FaultPlan::new("seed=9;xfer.fail=0.25".parse().unwrap());
        FaultPlan::new("connect.refuse=1".parse().unwrap());
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].contains("WARN")
            && lines[0].contains("fault injection is ON")
            && lines[0].contains("seed=9;xfer.fail=0.25"),
        "{text}"
    );
}
