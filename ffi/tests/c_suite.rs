//! Builds the C suite (tests/c) with `cc` against ffi/include/nccl.h and,
//! when `RCCLRS_NVIDIA_NCCL_INCLUDE` names NVIDIA's include folders
//! (colon-separated: nccl's and CUDA's, as `.ci/run` downloads them),
//! against NVIDIA's nccl.h too; links it as `libnccl.so.2` (a link to
//! librcclrs.so, the drop-in way) and runs every case.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod nvidia;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// librcclrs.so of this build (cargo builds the cdylib with the rlib).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join("librcclrs.so"),
        deps.parent().unwrap().join("librcclrs.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .expect("librcclrs.so next to the test binary")
}

/// A folder where `libnccl.so.2` is librcclrs.so.
fn dropin_dir(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c-suite-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libnccl.so.2");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(cdylib(), &link).unwrap();
    dir
}

fn compile(source: &str, out: &Path, includes: &[PathBuf], extra: &[&str], link: &[String]) {
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror"])
        .args(extra);
    for inc in includes {
        cmd.arg("-I").arg(inc);
    }
    cmd.arg(repo().join("tests/c").join(source))
        .arg("-o")
        .arg(out);
    cmd.args(link).args(["-lpthread", "-lm", "-ldl"]);
    let status = cmd.status().expect("running cc");
    assert!(status.success(), "cc failed: {cmd:?}");
}

fn dropin_link(dir: &Path) -> Vec<String> {
    vec![
        format!("-L{}", dir.display()),
        "-l:libnccl.so.2".to_string(),
    ]
}

fn run(binary: &Path, lib_dir: &Path, arg: &str) -> String {
    run_with(binary, lib_dir, arg, &[])
}

fn run_with(binary: &Path, lib_dir: &Path, arg: &str, env: &[(&str, &str)]) -> String {
    let mut child = Command::new(binary)
        .arg(arg)
        .envs(env.iter().copied())
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("RCCL_TIMEOUT_MS", "60000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!("{} {arg} timed out", binary.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{} {arg} failed:\n{text}",
        binary.display()
    );
    text
}

/// Compiles abi.c and suite.c with `includes` and runs every case;
/// returns abi.c's output.
fn suite(tag: &str, includes: &[PathBuf]) -> String {
    let dir = dropin_dir(tag);
    let (abi, suite) = (dir.join("abi"), dir.join("suite"));
    compile("abi.c", &abi, includes, &[], &dropin_link(&dir));
    compile("suite.c", &suite, includes, &[], &dropin_link(&dir));
    let layout = run(&abi, &dir, "");
    let list = run(&suite, &dir, "list");
    let cases: Vec<&str> = list.lines().collect();
    assert!(cases.len() >= 10, "too few cases: {cases:?}");
    for case in cases {
        let start = Instant::now();
        let out = run(&suite, &dir, case);
        eprintln!(
            "[{tag}] {case}: {:.2}s: {}",
            start.elapsed().as_secs_f64(),
            out.trim().replace('\n', " | ")
        );
    }
    layout
}

fn own_include() -> Vec<PathBuf> {
    vec![repo().join("ffi/include")]
}

/// NVIDIA's include folders, once their nccl.h is known to be the API level
/// ffi/include/nccl.h implements: the ABI comparisons hold at one version
/// only, so another version fails here, saying so, rather than as a
/// difference somewhere in the output.
fn nvidia_include() -> Option<Vec<PathBuf>> {
    let dirs = nvidia::include_dirs()?;
    let theirs =
        nvidia::nccl_h(&dirs).expect("RCCLRS_NVIDIA_NCCL_INCLUDE names no folder with nccl.h");
    let ours = repo().join("ffi/include/nccl.h");
    let (theirs_text, ours_text) = (read(&theirs), read(&ours));
    let code = |text, header: &Path| {
        nvidia::define(text, "NCCL_VERSION_CODE")
            .unwrap_or_else(|| panic!("{} defines no NCCL_VERSION_CODE", header.display()))
    };
    let (theirs_code, ours_code) = (code(&theirs_text, &theirs), code(&ours_text, &ours));
    assert_eq!(
        theirs_code,
        ours_code,
        "{} is NCCL_VERSION_CODE {theirs_code}, {} implements {ours_code}: move \
         ffi/include/nccl.h (and its tests) to that version, or pin the one it \
         implements (.ci/run's nvidia_pins)",
        theirs.display(),
        ours.display()
    );
    Some(dirs)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn c_suite_with_our_header() {
    let layout = suite("own", &own_include());
    assert!(layout.contains("functions: 144"), "{layout}");
}

#[test]
fn c_suite_with_nvidia_header_and_identical_abi() {
    let Some(nvidia) = nvidia_include() else {
        eprintln!(
            "SKIPPED: RCCLRS_NVIDIA_NCCL_INCLUDE is not set \
             (.ci/run downloads NVIDIA's headers and sets it)"
        );
        return;
    };
    let theirs = suite("nvidia", &nvidia);
    let dir = dropin_dir("abi-compare");
    compile(
        "abi.c",
        &dir.join("abi-own"),
        &own_include(),
        &[],
        &dropin_link(&dir),
    );
    let ours = run(&dir.join("abi-own"), &dir, "");
    assert_eq!(
        ours, theirs,
        "sizes, offsets, values or functions differ from NVIDIA's nccl.h"
    );
    // Our header after CUDA's own: cudaStream_t comes from CUDA's headers.
    let mut includes = own_include();
    includes.extend(nvidia);
    let mixed = dir.join("abi-mixed");
    compile(
        "abi.c",
        &mixed,
        &includes,
        &["-include", "cuda_runtime.h"],
        &dropin_link(&dir),
    );
    assert_eq!(run(&mixed, &dir, ""), ours);
}

#[test]
fn static_library_links() {
    let lib = cdylib().with_file_name("librcclrs.a");
    let lib = if lib.exists() {
        lib
    } else {
        cdylib()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("librcclrs.a")
    };
    assert!(lib.exists(), "{} missing", lib.display());
    let dir = dropin_dir("static");
    let out = dir.join("abi-static");
    compile(
        "abi.c",
        &out,
        &own_include(),
        &[],
        &[lib.display().to_string()],
    );
    assert!(run(&out, &dir, "").contains("functions: 144"));
}

/// Compiles tests/c/device_host.c with `includes` (and `extra` flags)
/// and runs its cases; returns its layout report.
fn device_host(tag: &str, includes: &[PathBuf], extra: &[&str]) -> String {
    let dir = dropin_dir(tag);
    let binary = dir.join("device_host");
    compile(
        "device_host.c",
        &binary,
        includes,
        extra,
        &dropin_link(&dir),
    );
    for case in ["teams", "unsupported"] {
        let out = run(&binary, &dir, case);
        eprintln!("[{tag}] {case}:\n{out}");
        assert!(out.contains(&format!("{case}: ok")), "{out}");
    }
    run(&binary, &dir, "layout")
}

/// tests/c/device_host.c: the host side of the device API (properties,
/// teams, the calls that need device code and fail saying so), built
/// against ffi/include/nccl_device/host.h and, when present, NVIDIA's
/// (whose layouts must match ours).
#[test]
fn device_api_host_side() {
    // NCCL_COMM_PROPERTIES_INITIALIZER names only the leading fields.
    let ours = device_host(
        "device-host-own",
        &own_include(),
        &["-Wno-missing-field-initializers"],
    );
    let Some(nvidia) = nvidia_include() else {
        eprintln!("SKIPPED the comparison with NVIDIA's nccl_device/host.h: RCCLRS_NVIDIA_NCCL_INCLUDE is not set");
        return;
    };
    // NVIDIA's header declares inline device helpers that C never defines.
    let theirs = device_host(
        "device-host-nvidia",
        &nvidia,
        &["-Wno-missing-field-initializers", "-Wno-error"],
    );
    assert_eq!(
        ours, theirs,
        "layouts differ from NVIDIA's nccl_device/host.h"
    );
}

/// tests/c/emu.c: a C program on the emulated GPU (device buffers,
/// streams, groups, events, through rcclrs_emu.h).
#[test]
fn c_program_on_the_emulated_gpu() {
    let dir = dropin_dir("emu");
    let binary = dir.join("emu");
    compile("emu.c", &binary, &own_include(), &[], &dropin_link(&dir));
    let out = run_with(&binary, &dir, "", &[("RCCL_DEVICE", "emu")]);
    assert!(out.contains("emu: ok"), "{out}");
}

/// tests/c/memory.c: ncclCommMemStats, ncclCommSuspend and ncclCommResume
/// on 2 and 4 ranks as threads and as processes, over host memory and on
/// the emulated GPU, results checked, the misuses' errors, and the
/// refusal past NCCL_MAX_MEM_BYTES.
#[test]
fn memory_statistics_suspend_and_resume_from_c() {
    program_in_modes("memory", &["threads", "processes", "emu", "emu-processes"]);
}

/// tests/c/encryption.c: ranks with one PSK over TCP at 2 and 4 ranks, as
/// threads and as processes, over host memory and on the emulated GPU,
/// results checked; a process with another key is refused and its root
/// fails at its timeout, naming it.
#[test]
fn encryption_from_c() {
    let modes = ["threads", "processes", "emu", "emu-processes", "wrong-key"];
    program_in_modes("encryption", &modes);
}

/// Compiles tests/c/`name`.c against our header and runs it once per mode
/// (its one argument), with the emulated GPU as the device; each run must
/// end saying `<name> <mode>: ok`.
fn program_in_modes(name: &str, modes: &[&str]) {
    let program = Program::compile(name, "");
    for mode in modes {
        let emu = [("RCCL_DEVICE", "emu")];
        let out = run_with(&program.binary, &program.dir, mode, &emu);
        assert!(out.contains(&format!("{name} {mode}: ok")), "{out}");
        eprintln!("{}", out.trim());
    }
}

/// tests/c/one_sided.c: windows, puts, signals and waits through the C ABI
/// at 2 and 4 ranks, as threads of one process (windows registered by
/// one thread in a group) and as processes (on one host and on two),
/// every misuse with its error text; a wait on a peer that died ends
/// naming it; and on the emulated GPU's device memory, on streams, as
/// threads and as processes at 2 and 4 ranks.
#[test]
fn one_sided_c_program() {
    const SIG2: &[(&str, &str)] = &[("NCCL_NUM_RMA_SIG", "2")];
    const EMU: &[(&str, &str)] = &[("NCCL_NUM_RMA_SIG", "2"), ("RCCL_DEVICE", "emu")];
    const DEVICE: &[(&str, &str)] = &[("RCCL_DEVICE", "emu")];
    const RUNS: &[Run] = &[
        Run::threads("threads", 2, &[], SIG2),
        Run::threads("threads", 4, &[], SIG2),
        Run::threads("emu", 2, &[], EMU),
        Run::threads("emu", 4, &[], EMU),
        Run::processes("emu", 2, &[], DEVICE),
        Run::processes("emu", 4, &[], DEVICE),
        Run::processes("rank", 2, &[], &[]),
        Run::processes("rank", 4, &[], &[]),
        // Two hosts, alternating around the ring.
        Run::processes("rank", 4, &["2"], &[]),
        Run::processes("dies", 2, &[], &[]),
    ];
    let program = Program::compile("one_sided", "ONE_SIDED_ID");
    for run in RUNS {
        program.run(run);
    }
}

/// tests/c/symmetric.c: all-reduce, reduce-scatter and all-gather on
/// symmetric windows through the C ABI, every result checked in C, as
/// threads and as processes at 2 and 4 ranks, on host memory and the
/// emulated GPU's device windows; the tuner's log lines prove
/// that the host runs took the windows (and the staged ones and the
/// emulated GPU's did not), and every run's results have the same digest
/// per rank count and rank.
#[test]
fn symmetric_collectives_c_program() {
    const LOG: &[(&str, &str)] = &[("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "TUNING")];
    const EMU: &[(&str, &str)] = &[
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_DEBUG_SUBSYS", "TUNING"),
        ("RCCL_DEVICE", "emu"),
    ];
    const RUNS: &[Run] = &[
        Run::threads("threads", 2, &[], LOG),
        Run::threads("threads", 4, &[], LOG),
        Run::processes("rank", 2, &[], LOG),
        Run::processes("rank", 4, &[], LOG),
        Run::threads("threads", 4, &["staged"], LOG),
        Run::processes("rank", 2, &["staged"], LOG),
        Run::threads("emu", 2, &[], EMU),
        Run::threads("emu", 4, &[], EMU),
        Run::processes("emu", 2, &[], EMU),
        Run::processes("emu", 4, &[], EMU),
    ];
    let program = Program::compile("symmetric", "SYMMETRIC_ID");
    // (ranks, rank) -> the digest of its results.
    let mut digests = std::collections::BTreeMap::new();
    for run in RUNS {
        let outputs = program.run(run);
        let text = outputs.concat();
        let lines = |what: &str| text.lines().filter(|l| l.contains(what)).count();
        let (mut calls, mut on_windows) = (0, 0);
        let reports: Vec<&str> = text.lines().filter(|l| l.contains(" calls, ")).collect();
        assert_eq!(
            reports.len(),
            run.n,
            "{run:?}: one report per rank:\n{text}"
        );
        for report in reports {
            // "rank R of N: C calls, E on symmetric windows expected, digest D"
            let words: Vec<&str> = report
                .split([' ', ':', ','])
                .filter(|w| !w.is_empty())
                .collect();
            let number = |i: usize| words[i].parse::<usize>().expect(report);
            calls += number(4);
            on_windows += number(6);
            let digest = words[12].to_string();
            let key = (number(3), number(1));
            let first = digests.entry(key).or_insert_with(|| digest.clone());
            assert_eq!(
                *first, digest,
                "{run:?}: rank {} of {} results differ",
                key.1, key.0
            );
        }
        assert!(
            lines(" -> Algo ") >= calls,
            "{run:?}: {calls} calls, fewer TUNING lines:\n{text}"
        );
        let (one, two) = (
            lines("-> symmetric one-shot on windows"),
            lines("-> symmetric two-shot on windows"),
        );
        assert_eq!(one + two, on_windows, "{run:?}: calls on symmetric windows");
        assert!(
            on_windows == 0 || one > 0 && two > 0,
            "{run:?}: {one} one-shot and {two} two-shot calls"
        );
        eprintln!("{run:?}: {calls} calls, {one} one-shot and {two} two-shot on windows");
    }
}

/// A C program of tests/c built against our nccl.h, run as `libnccl.so.2`.
struct Program {
    binary: PathBuf,
    dir: PathBuf,
    /// The variable naming the file in which rank 0 hands over the unique
    /// id when ranks are processes.
    id_var: &'static str,
}

/// One run of a C program: its ranks as threads of one process
/// (`mode N extra..`) or as processes (`mode R N extra..` each), with
/// `env`.
#[derive(Debug)]
struct Run {
    mode: &'static str,
    processes: bool,
    n: usize,
    extra: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

impl Run {
    const fn threads(
        mode: &'static str,
        n: usize,
        extra: &'static [&'static str],
        env: &'static [(&'static str, &'static str)],
    ) -> Run {
        Run {
            mode,
            processes: false,
            n,
            extra,
            env,
        }
    }

    const fn processes(
        mode: &'static str,
        n: usize,
        extra: &'static [&'static str],
        env: &'static [(&'static str, &'static str)],
    ) -> Run {
        Run {
            processes: true,
            ..Run::threads(mode, n, extra, env)
        }
    }

    /// Each process's arguments.
    fn args(&self) -> Vec<Vec<String>> {
        let n = self.n.to_string();
        let ranks: Vec<Vec<String>> = if self.processes {
            (0..self.n)
                .map(|r| vec![r.to_string(), n.clone()])
                .collect()
        } else {
            vec![vec![n]]
        };
        ranks
            .into_iter()
            .map(|numbers| {
                std::iter::once(self.mode.to_string())
                    .chain(numbers)
                    .chain(self.extra.iter().map(|e| e.to_string()))
                    .collect()
            })
            .collect()
    }
}

impl Program {
    fn compile(name: &str, id_var: &'static str) -> Program {
        let dir = dropin_dir(&name.replace('_', "-"));
        let binary = dir.join(name);
        compile(
            &format!("{name}.c"),
            &binary,
            &own_include(),
            &[],
            &dropin_link(&dir),
        );
        Program {
            binary,
            dir,
            id_var,
        }
    }

    /// Starts every process of `run` at once, rank 0 handing the unique
    /// id over in a fresh file, asserts that each succeeds (saying "ok")
    /// within two minutes, and returns their outputs.
    fn run(&self, run: &Run) -> Vec<String> {
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let count = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id_file = self.dir.join(format!("id-{}-{count}", std::process::id()));
        let _ = std::fs::remove_file(&id_file);
        let args = run.args();
        let mut children: Vec<_> = args
            .iter()
            .map(|args| {
                Command::new(&self.binary)
                    .args(args)
                    .envs(run.env.iter().copied())
                    .env("LD_LIBRARY_PATH", &self.dir)
                    .env(self.id_var, &id_file)
                    .env("RCCL_TIMEOUT_MS", "60000")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // Read as they run: a chatty child must not block on a full pipe.
        let readers: Vec<_> = children
            .iter_mut()
            .map(|child| {
                let (mut out, mut err) =
                    (child.stdout.take().unwrap(), child.stderr.take().unwrap());
                std::thread::spawn(move || {
                    use std::io::Read;
                    let err = std::thread::spawn(move || {
                        let mut text = Vec::new();
                        let _ = err.read_to_end(&mut text);
                        text
                    });
                    let mut text = Vec::new();
                    let _ = out.read_to_end(&mut text);
                    text.extend(err.join().unwrap());
                    String::from_utf8_lossy(&text).into_owned()
                })
            })
            .collect();
        let start = Instant::now();
        while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
            if start.elapsed() > Duration::from_secs(120) {
                for child in &mut children {
                    let _ = child.kill();
                }
                panic!("{run:?} timed out");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        args.iter()
            .zip(children)
            .zip(readers)
            .map(|((args, mut child), reader)| {
                let status = child.wait().unwrap();
                let text = reader.join().unwrap();
                assert!(
                    status.success() && text.contains("ok"),
                    "{args:?} failed:\n{text}"
                );
                text
            })
            .collect()
    }
}
