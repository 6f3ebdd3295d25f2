//! Schedules from files: the example loads, proves and scales with count;
//! a wrong one is refused with the verifier's error naming the bad step.

use std::path::PathBuf;

use rccl_algorithms::verify::Loc;
use rccl_algorithms::{
    load_schedule_file, parse_schedule, verify, Algorithm, CollKind, CollSpec, FileError, Params,
    VerifyError,
};

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("schedules")
        .join(name)
}

#[test]
fn example_ring_allreduce_loads_and_scales() {
    let alg = load_schedule_file(path("ring_allreduce_4.json")).expect("the example is correct");
    assert_eq!(alg.name(), "ring4");
    assert_eq!(
        (alg.kind(), alg.nranks(), alg.parts()),
        (CollKind::AllReduce, 4, 4)
    );
    assert!(alg.supports_in_place(CollKind::AllReduce));
    for count in [4, 8, 40, 404] {
        let spec = CollSpec {
            kind: CollKind::AllReduce,
            nranks: 4,
            root: 0,
            count,
        };
        assert!(alg.fits(&spec));
        for chunk in [1, 3, 64] {
            let params = Params {
                nchannels: 2,
                chunk_elems: chunk,
            };
            for in_place in [false, true] {
                verify(&alg, &spec, &params, in_place).expect("scaled file verifies");
            }
        }
    }
    let odd = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 4,
        root: 0,
        count: 6,
    };
    assert!(!alg.fits(&odd));
    let other = CollSpec {
        kind: CollKind::AllReduce,
        nranks: 5,
        root: 0,
        count: 8,
    };
    assert!(!alg.fits(&other));
}

#[test]
fn wrong_file_is_refused_naming_the_step() {
    let err = load_schedule_file(path("wrong_ring_allreduce_4.json")).unwrap_err();
    let FileError::Verify { error, .. } = &err else {
        panic!("expected a verifier error, got {err}");
    };
    // Rank 2 reduces block 1 where its own block 2 belongs: the mix is
    // caught at the first primitive that meets it.
    let at: Loc = match error.as_ref() {
        VerifyError::MixedElements { at, .. } => *at,
        other => panic!("unexpected error {other}"),
    };
    assert_eq!((at.channel, at.step, at.name), (0, 3, "recvReduceCopySend"));
    let text = err.to_string();
    assert!(text.contains("step 3"), "{text}");
    assert!(text.contains("wrong_ring_allreduce_4.json"), "{text}");
}

#[test]
fn malformed_files_are_refused() {
    let parse = |text: &str| parse_schedule("inline", text).unwrap_err();
    assert!(matches!(parse("{"), FileError::Parse { .. }));
    assert!(matches!(
        parse(
            r#"{"name":"x","collective":"AllReduce","nranks":1,"parts":1,"ranks":[{"channels":[[[{"op":"frobnicate"}]]]}]}"#
        ),
        FileError::Parse { .. }
    ));
    assert!(matches!(
        parse(r#"{"name":"x","collective":"Nope","nranks":1,"parts":1,"ranks":[]}"#),
        FileError::Invalid { .. }
    ));
    assert!(matches!(
        parse(
            r#"{"name":"x","collective":"AllReduce","nranks":2,"parts":1,"ranks":[{"channels":[]}]}"#
        ),
        FileError::Invalid { .. }
    ));
    // A deadlock: both ranks wait to receive first.
    let deadlock = r#"{"name":"x","collective":"AllGather","nranks":2,"parts":1,"ranks":[
        {"channels":[[[{"op":"recv","from":1,"dst":["recv",1,1]}],[{"op":"copySend","src":["send",0,1],"dst":["recv",0,1],"to":1}]]]},
        {"channels":[[[{"op":"recv","from":0,"dst":["recv",0,1]}],[{"op":"copySend","src":["send",0,1],"dst":["recv",1,1],"to":0}]]]}]}"#;
    match parse(deadlock) {
        FileError::Verify { error, .. } => {
            assert!(matches!(*error, VerifyError::Deadlock { .. }), "{error}")
        }
        other => panic!("expected a deadlock, got {other}"),
    }
    let one_rank = r#"{"name":"x","collective":"AllReduce","nranks":1,"parts":1,"ranks":[
        {"channels":[[[{"op":"copy","src":["send",0,1],"dst":["recv",0,1]}]]]}]}"#;
    assert!(parse_schedule("inline", one_rank).is_ok());
}
