//! The parameter API (`ncclParam*`): the settings rccl-rs reads, by key,
//! from the environment or their defaults.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::LazyLock;

use crate::abi::*;
use crate::check::{invalid, non_null, write_out};
use crate::error::{c_string, guard};

/// A parameter: its environment variable and default.
pub struct Param {
    pub key: &'static str,
    pub default: Option<String>,
    c_key: CString,
}

const KNOWN: &[(&str, Option<&str>)] = &[
    ("NCCL_BUFFSIZE", Some("4194304")),
    ("NCCL_MIN_NCHANNELS", Some("1")),
    ("NCCL_MAX_NCHANNELS", Some("2")),
    ("NCCL_COMM_ID", None),
    ("NCCL_COMM_SECRET", None),
    ("RCCL_KEY_FILE", None),
    ("RCCL_INSECURE_ADDRESS_SECRET", None),
    ("NCCL_SOCKET_IFNAME", None),
    ("RCCL_NIC_SPEED", None),
    ("RCCL_TIMEOUT_MS", Some("300000")),
    ("RCCL_BOARD_BYTES", Some("65536")),
    ("RCCL_BOOTSTRAP_ROOT_TIMEOUT", Some("300")),
    ("RCCL_SIM_CLUSTER", None),
];

/// Parameters whose default is this machine's: the last-level cache's
/// size for `RCCL_NT_STORE_BYTES`.
fn machine_defaults() -> [(&'static str, Option<String>); 1] {
    [(
        "RCCL_NT_STORE_BYTES",
        Some(rccl::last_level_cache_bytes().to_string()),
    )]
}

static PARAMS: LazyLock<Vec<Param>> = LazyLock::new(|| {
    KNOWN
        .iter()
        .map(|&(key, default)| (key, default.map(str::to_string)))
        .chain(machine_defaults())
        .map(|(key, default)| Param {
            key,
            default,
            c_key: c_string(key),
        })
        .collect()
});

static KEY_TABLE: LazyLock<Vec<usize>> =
    LazyLock::new(|| PARAMS.iter().map(|p| p.c_key.as_ptr() as usize).collect());

thread_local! {
    static STR_OUT: RefCell<CString> = RefCell::new(CString::default());
    static VALUE_OUT: RefCell<CString> = RefCell::new(CString::default());
}

impl Param {
    /// The value in force: the environment's, else the default.
    pub fn value(&self) -> Option<String> {
        rccl::env::var(self.key).or_else(|| self.default.clone())
    }
}

/// The parameter named `key` (with or without the `NCCL_` prefix).
fn find(key: *const c_char) -> rccl::Result<&'static Param> {
    non_null(key, "key")?;
    // SAFETY: a C string, per nccl.h.
    let key = unsafe { CStr::from_ptr(key) }.to_string_lossy();
    PARAMS
        .iter()
        .find(|p| p.key == key || p.key.strip_prefix("NCCL_") == Some(&*key))
        .ok_or_else(|| invalid(format!("unknown parameter '{key}'")))
}

fn param(h: ncclParamHandle_t) -> rccl::Result<&'static Param> {
    PARAMS
        .iter()
        .find(|p| std::ptr::eq(*p as *const Param, h as *const Param))
        .ok_or_else(|| invalid(format!("{h:p} is not a parameter handle")))
}

fn value(h: ncclParamHandle_t) -> rccl::Result<String> {
    let p = param(h)?;
    p.value()
        .ok_or_else(|| invalid(format!("parameter {} is not set and has no default", p.key)))
}

macro_rules! typed_getters {
    ($($name:ident / $pname:ident : $t:ty),* $(,)?) => {
        nccl_api! {$(
            fn $name / $pname(h: ncclParamHandle_t, out: *mut $t) -> ncclResult_t {
                guard(stringify!($name), std::ptr::null_mut(), || {
                    non_null(out, "out")?;
                    let text = value(h)?;
                    let v: $t = text.trim().parse().map_err(|_| {
                        invalid(format!("value '{text}' does not fit {}", stringify!($t)))
                    })?;
                    // SAFETY: the caller vouches for `out` as an out-argument.
                    unsafe { write_out(out, v, "out")? };
                    Ok(ncclSuccess)
                })
            }
        )*}
    };
}

typed_getters!(
    ncclParamGetI8 / pncclParamGetI8: i8,
    ncclParamGetI16 / pncclParamGetI16: i16,
    ncclParamGetI32 / pncclParamGetI32: i32,
    ncclParamGetI64 / pncclParamGetI64: i64,
    ncclParamGetU8 / pncclParamGetU8: u8,
    ncclParamGetU16 / pncclParamGetU16: u16,
    ncclParamGetU32 / pncclParamGetU32: u32,
    ncclParamGetU64 / pncclParamGetU64: u64,
);

nccl_api! {
    /// A handle to the parameter `key` (`NCCL_BUFFSIZE` or `BUFFSIZE`).
    fn ncclParamBind / pncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t {
        guard("ncclParamBind", std::ptr::null_mut(), || {
            non_null(out, "out")?;
            let p = find(key)?;
            // SAFETY: the caller vouches for `out` as an out-argument.
            unsafe { write_out(out, p as *const Param as ncclParamHandle_t, "out")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclParamGetStr / pncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t {
        guard("ncclParamGetStr", std::ptr::null_mut(), || {
            non_null(out, "out")?;
            let text = c_string(&value(h)?);
            STR_OUT.with(|s| {
                *s.borrow_mut() = text;
                // SAFETY: the caller vouches for `out` as an out-argument.
                unsafe { write_out(out, s.borrow().as_ptr(), "out") }
            })?;
            Ok(ncclSuccess)
        })
    }

    /// The value's text, without a terminating NUL, into `out`.
    fn ncclParamGet / pncclParamGet(
        h: ncclParamHandle_t, out: *mut c_void, maxLen: c_int, len: *mut c_int
    ) -> ncclResult_t {
        guard("ncclParamGet", std::ptr::null_mut(), || {
            non_null(len, "len")?;
            let text = value(h)?;
            let max = usize::try_from(maxLen).map_err(|_| invalid(format!("maxLen {maxLen} is negative")))?;
            if text.len() > max {
                return Err(invalid(format!("the value needs {} bytes, maxLen is {maxLen}", text.len())));
            }
            if !text.is_empty() {
                non_null(out, "out")?;
                // SAFETY: the caller vouches that `out` (checked non-NULL)
                // holds `maxLen` bytes, and the text fits in them.
                unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), out.cast::<u8>(), text.len()) };
            }
            // SAFETY: the caller vouches for `len` as an out-argument.
            unsafe { write_out(len, text.len() as c_int, "len")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclParamGetParameter / pncclParamGetParameter(
        key: *const c_char, value_: *mut *const c_char, valueLen: *mut c_int
    ) -> ncclResult_t {
        guard("ncclParamGetParameter", std::ptr::null_mut(), || {
            non_null(value_, "value")?;
            let p = find(key)?;
            let text = p.value().unwrap_or_default();
            VALUE_OUT.with(|s| {
                *s.borrow_mut() = c_string(&text);
                // SAFETY: the caller vouches for `value` as an out-argument.
                unsafe { write_out(value_, s.borrow().as_ptr(), "value") }
            })?;
            if !valueLen.is_null() {
                // SAFETY: the caller vouches for a non-NULL `valueLen` as
                // an out-argument.
                unsafe { write_out(valueLen, text.len() as c_int, "valueLen")? };
            }
            Ok(ncclSuccess)
        })
    }

    fn ncclParamGetAllParameterKeys / pncclParamGetAllParameterKeys(
        table: *mut *const *const c_char, tableLen: *mut c_int
    ) -> ncclResult_t {
        guard("ncclParamGetAllParameterKeys", std::ptr::null_mut(), || {
            non_null(table, "table")?;
            non_null(tableLen, "tableLen")?;
            // SAFETY: the caller vouches for `table` and `tableLen` as
            // out-arguments.
            unsafe {
                write_out(table, KEY_TABLE.as_ptr().cast::<*const c_char>(), "table")?;
                write_out(tableLen, KEY_TABLE.len() as c_int, "tableLen")?;
            }
            Ok(ncclSuccess)
        })
    }

    /// Prints every parameter and its value to stderr.
    fn ncclParamDumpAll / pncclParamDumpAll() {
        let _ = std::panic::catch_unwind(|| {
            for p in PARAMS.iter() {
                eprintln!("{}={}", p.key, p.value().unwrap_or_else(|| "(unset)".into()));
            }
        });
    }
}
