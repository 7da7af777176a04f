//! `docs/protocol.md` is normative: every ```` ```hex NAME ```` block in it decodes to the
//! frame this test builds, byte for byte.

use hmc_rpc::frame::{
    Flags, FrameHeader, FrameKind, FrameLimits, HEADER_LEN, PayloadMode, Status, check_payload_crc,
    payload_crc,
};
use hmc_rpc::{RpcCodec, demo};

const DOC: &str = include_str!("../../docs/protocol.md");

fn frame(h: FrameHeader, body: &[u8]) -> Vec<u8> {
    let mut v = h.encode().to_vec();
    v.extend_from_slice(body);
    v
}

fn inline(
    kind: FrameKind,
    id: u64,
    method: u32,
    status: Status,
    body: &[u8],
    deadline_us: u32,
) -> Vec<u8> {
    let mut h = FrameHeader::new(kind, id);
    h.method_id = method;
    h.status = status;
    h.payload_len = body.len() as u64;
    h.body_len = body.len() as u32;
    h.payload_crc = payload_crc(body);
    h.deadline_us = deadline_us;
    frame(h, body)
}

/// The examples of the document, built with the crate's own encoder.
fn examples() -> Vec<(&'static str, Vec<u8>)> {
    let req = RpcCodec::encode("hello hmc rpc").unwrap();
    let resp = RpcCodec::encode("HELLO HMC RPC").unwrap();
    let reason = b"server shutting down";
    let mut goaway = FrameHeader::new(FrameKind::GoAway, 0);
    goaway.status = Status::SHUTTING_DOWN;
    goaway.payload_len = reason.len() as u64;
    goaway.body_len = reason.len() as u32;
    let stream_payload = b"0123456789";
    let mut stream = FrameHeader::new(FrameKind::Request, 3);
    stream.method_id = demo::ECHO;
    stream.mode = PayloadMode::TcpStream;
    stream.payload_len = 10;
    // This implementation leaves the whole-payload CRC of a stream at 0 (chunks carry theirs).
    stream.payload_crc = 0;
    let _ = stream_payload;
    let data = |chunk: &[u8], end: bool| {
        let mut d = stream;
        d.kind = FrameKind::Data;
        d.body_len = chunk.len() as u32;
        d.payload_crc = payload_crc(chunk);
        if end {
            d.flags = Flags::END;
        }
        frame(d, chunk)
    };
    vec![
        (
            "settings-request",
            inline(
                FrameKind::Request,
                1,
                hmc_rpc::settings::SETTINGS_METHOD,
                Status::OK,
                &hmc_rpc::settings::Settings {
                    features: hmc_rpc::settings::features::SETTINGS,
                    data_planes: vec![1],
                    ..Default::default()
                }
                .encode(),
                0,
            ),
        ),
        (
            "request-uppercase",
            inline(
                FrameKind::Request,
                1,
                demo::UPPERCASE,
                Status::OK,
                &req,
                30_000_000,
            ),
        ),
        (
            "response-uppercase",
            inline(
                FrameKind::Response,
                1,
                demo::UPPERCASE,
                Status::OK,
                &resp,
                0,
            ),
        ),
        (
            "response-unknown-method",
            inline(
                FrameKind::Response,
                2,
                99,
                Status::UNKNOWN_METHOD,
                b"no method 99",
                0,
            ),
        ),
        ("cancel", frame(FrameHeader::new(FrameKind::Cancel, 1), &[])),
        ("ping", frame(FrameHeader::new(FrameKind::Ping, 42), &[])),
        ("pong", frame(FrameHeader::new(FrameKind::Pong, 42), &[])),
        ("goaway-shutting-down", frame(goaway, reason)),
        ("stream-request-header", frame(stream, &[])),
        ("stream-data-1", data(b"01234", false)),
        ("stream-data-2-end", data(b"56789", true)),
    ]
}

fn doc_blocks() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut cur: Option<(String, String)> = None;
    for line in DOC.lines() {
        if let Some((name, hex)) = cur.as_mut() {
            if line.trim() == "```" {
                let bytes = hex
                    .split_whitespace()
                    .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
                    .collect();
                out.push((std::mem::take(name), bytes));
                cur = None;
            } else {
                hex.push(' ');
                hex.push_str(line);
            }
        } else if let Some(name) = line.trim().strip_prefix("```hex ") {
            cur = Some((name.trim().to_string(), String::new()));
        }
    }
    out
}

#[test]
fn every_example_frame_in_the_document_is_byte_exact() {
    let want = examples();
    let got = doc_blocks();
    let names: Vec<_> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, want.iter().map(|(n, _)| *n).collect::<Vec<_>>());
    for ((name, doc), (_, built)) in got.iter().zip(&want) {
        assert_eq!(doc, built, "example `{name}` differs from the encoder");
    }
}

#[test]
fn every_example_frame_in_the_document_decodes_and_checks_out() {
    for (name, bytes) in doc_blocks() {
        let h = FrameHeader::decode(&bytes, &FrameLimits::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let body = &bytes[HEADER_LEN..];
        assert_eq!(body.len(), h.body_len as usize, "{name}");
        if h.mode == PayloadMode::Inline || h.kind == FrameKind::Data {
            check_payload_crc(h.request_id, h.payload_crc, body).unwrap();
        }
    }
}

#[test]
#[ignore = "prints the examples for docs/protocol.md"]
fn print_examples() {
    for (name, bytes) in examples() {
        println!("```hex {name}");
        for line in bytes.chunks(16) {
            let l: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
            println!("{}", l.join(" "));
        }
        println!("```\n");
    }
}
