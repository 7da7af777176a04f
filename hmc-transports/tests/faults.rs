//! Faults by name and by option: `faulty:NAME`, [`Options::faults`] and `HMC_FAULTS`
//! (as [`Environment::faults`]) wrap what opens in `hmc_faults::Faulty`; nothing does
//! otherwise, and a malformed spec is refused naming the item.

#![cfg(feature = "tcp")]

use std::net::IpAddr;
use std::time::Duration;

use hmc_core::{Access, Communicator, Deadline, Device, Op, Region, TransferDesc, TransportId};
use hmc_transports::{FaultPlan, FaultSpec, Options, TransportName, fault_plan, open};

const LO: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn plan(spec: &str) -> FaultPlan {
    FaultPlan::new(spec.parse().unwrap())
}

fn with_env(faults: &str) -> Options {
    let mut o = Options::default();
    o.environment.faults = Some(faults.into());
    o
}

#[rstest::rstest]
#[case::plain_name("tcp", Options::default(), None)]
#[case::faulty_name_without_a_spec("faulty:tcp", Options::default(), Some(FaultSpec::DEFAULT_TEXT))]
#[case::the_environment("tcp", with_env("seed=3;xfer.fail=0.5"), Some("seed=3;xfer.fail=0.5"))]
#[case::the_option_over_the_environment(
    "faulty:tcp",
    Options { faults: Some(plan("xfer.cut=0.5")), ..with_env("xfer.fail=1") },
    Some("xfer.cut=0.5")
)]
fn which_faults_a_name_and_options_ask_for(
    #[case] name: &str,
    #[case] options: Options,
    #[case] want: Option<&str>,
) {
    let got = fault_plan(&name.parse().unwrap(), &options).unwrap();
    let want = want.map(|w| w.parse::<FaultSpec>().unwrap());
    assert_eq!(got.map(|p| p.spec().clone()), want);
}

#[test]
fn a_malformed_environment_spec_is_refused_naming_the_variable_and_the_item() {
    let e = open(&TransportName::Tcp, LO, &with_env("xfer.fail=2"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("HMC_FAULTS=xfer.fail=2")
            && e.contains("`xfer.fail=2`")
            && e.contains("fault spec grammar"),
        "{e}"
    );
}

/// `faulty:tcp` moves bytes as tcp does, failing where its plan says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faulty_tcp_fails_the_transfer_its_plan_says_and_moves_the_next() {
    let secret = hmc_transport_tcp::AuthSecret::new(*b"faults-by-name-secret").unwrap();
    let mut options = Options {
        faults: Some(plan("xfer.fail=first:1")),
        ..Options::default()
    };
    options.tcp.auth_secret = Some(secret);
    let a = open(&"faulty:tcp".parse().unwrap(), LO, &options).unwrap();
    let b = open(
        &TransportName::Tcp,
        LO,
        &Options {
            faults: None,
            ..options
        },
    )
    .unwrap();
    assert_eq!(a.transport(), TransportId::TCP);

    let src = vec![7u8; 4096];
    let dst = vec![0u8; 4096];
    let region = |v: &Vec<u8>| Region {
        device: Device::HOST,
        addr: v.as_ptr() as u64,
        len: v.len(),
    };
    // SAFETY: both vectors outlive the registrations (dropped at the end of the test,
    // after them: declared later, dropped first).
    let (ra, rb) = unsafe {
        (
            a.register(region(&src), Access::READ).unwrap(),
            b.register(region(&dst), Access::WRITE).unwrap(),
        )
    };
    let deadline = || Deadline::after(Duration::from_secs(10));
    let ep = a.connect(&b.address(), deadline()).await.unwrap();
    let key = a.import(&ep, &b.export(&rb).unwrap()).unwrap();
    let d = [TransferDesc::new(&ra, 0, &key, 0, 4096)];
    let e = a
        .transfer(&ep, Op::Write, &d, deadline())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("xfer.fail"), "{e}");
    assert!(
        dst.iter().all(|b| *b == 0),
        "a failed transfer moved nothing"
    );
    a.transfer(&ep, Op::Write, &d, deadline()).await.unwrap();
    assert_eq!(dst, src);
}

#[test]
fn an_unknown_name_says_faulty_names_exist() {
    let e = open(&"nosuch".parse().unwrap(), LO, &Options::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("faulty:<"), "{e}");
}
