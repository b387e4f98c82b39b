//! Links the drop-in libraries from this crate's `staticlib`:
//! `<target>/<profile>/softnic-ibverbs/{libibverbs.so.1, libmlx5.so.1, libefa.so.1}`;
//! or, for another [`Flavour`] (softnic-rdmacm's), the same from a staticlib that
//! contains this crate and more, plus companion libraries linked against it.
//!
//! Why a builder and not cargo alone: the version nodes need a GNU version script, which
//! only a `cc -shared` link of the staticlib honours (a `cdylib` gets rustc's own script
//! and unversioned symbols), and cargo has no post-link step. So whoever needs the
//! libraries — `softnic exec`, and the tests — calls [`ensure`]. It is cheap when
//! nothing changed: it relinks only when the staticlib is newer than the libraries.
//!
//! Where the staticlib is: cargo writes it as `<profile>/deps/libsoftnic_ibverbs-<hash>.a`
//! whenever it builds this crate (as a workspace member or as a dependency of
//! `softnic`), and also as `<profile>/libsoftnic_ibverbs.a` for `cargo build` of the
//! workspace; the newest of these is used. Needs a C compiler (`$CC`, default `cc`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// The version script of libibverbs.so.1.
pub const LIBIBVERBS_MAP: &str = include_str!("../libibverbs.map");
const MLX5_C: &str = include_str!("../c/mlx5.c");
const MLX5_MAP: &str = include_str!("../c/mlx5.map");
const EFA_C: &str = include_str!("../c/efa.c");
const EFA_MAP: &str = include_str!("../c/efa.map");

/// Name of the library directory inside a cargo profile directory.
pub const LIB_DIR_NAME: &str = "softnic-ibverbs";

/// Libraries [`ensure`] produces.
pub const LIBRARIES: [&str; 3] = ["libibverbs.so.1", "libmlx5.so.1", "libefa.so.1"];

/// The cargo profile directory (`target/debug`, `target/release`, …) an executable of
/// this build lives in: its own directory, or the parent of `deps/` for tests.
pub fn profile_dir_of(exe: &Path) -> PathBuf {
    let dir = exe.parent().unwrap_or(Path::new("."));
    if dir
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
    {
        dir.parent().unwrap_or(dir).to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest `libsoftnic_ibverbs*.a` of `profile_dir`.
pub fn find_staticlib(profile_dir: &Path) -> Result<PathBuf, String> {
    find_staticlib_of(profile_dir, IBVERBS.staticlib)
}

/// The newest `lib<stem>*.a` of `profile_dir` (`stem`: a crate name with `_`).
pub fn find_staticlib_of(profile_dir: &Path, stem: &str) -> Result<PathBuf, String> {
    let mut best: Option<(SystemTime, PathBuf)> = None;
    let mut consider = |p: PathBuf| {
        if let Some(t) = mtime(&p) {
            if best.as_ref().is_none_or(|(bt, _)| t > *bt) {
                best = Some((t, p));
            }
        }
    };
    consider(profile_dir.join(format!("lib{stem}.a")));
    if let Ok(entries) = std::fs::read_dir(profile_dir.join("deps")) {
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(&format!("lib{stem}-")) && name.ends_with(".a") {
                consider(e.path());
            }
        }
    }
    best.map(|(_, p)| p).ok_or_else(|| {
        format!(
            "no lib{stem}*.a in {} (or its deps/): build the workspace first \
             (cargo build)",
            profile_dir.display()
        )
    })
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| {
        format!(
            "cannot run {:?}: {e} (a C compiler is needed)",
            cmd.get_program()
        )
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} failed ({}):\n{}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn cc() -> Command {
    Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
}

/// Which staticlib `libibverbs.so.1` is linked from, where it goes, and what else is
/// linked beside it.
pub struct Flavour<'a> {
    /// Crate name of the staticlib (with `_`): `softnic_ibverbs`, or a crate that
    /// contains this one and more (`softnic_rdmacm`).
    pub staticlib: &'a str,
    /// Directory name inside the profile directory.
    pub dir: &'a str,
    /// Version-script nodes appended to `libibverbs.map` (symbols the companions call).
    pub extra_nodes: &'a str,
    /// Libraries linked against that `libibverbs.so.1`.
    pub companions: &'a [Companion<'a>],
}

/// A library linked against the flavour's `libibverbs.so.1`
/// (`-Wl,-z,defs`: every symbol it calls must be there).
pub struct Companion<'a> {
    /// Its soname and file name (`librdmacm.so.1`).
    pub soname: &'a str,
    /// Its source, GNU assembler (`.S`) for the C compiler.
    pub asm: &'a str,
    /// Its version script.
    pub map: &'a str,
}

/// libibverbs alone: `<profile>/softnic-ibverbs/`.
pub const IBVERBS: Flavour<'static> = Flavour {
    staticlib: "softnic_ibverbs",
    dir: LIB_DIR_NAME,
    extra_nodes: "",
    companions: &[],
};

/// Links the libraries into `<profile_dir>/softnic-ibverbs/` unless they are newer than
/// the staticlib, and returns that directory (what `LD_LIBRARY_PATH` must start with).
pub fn ensure(profile_dir: &Path) -> Result<PathBuf, String> {
    ensure_flavour(profile_dir, &IBVERBS)
}

/// [`ensure`] for any [`Flavour`]: links into `<profile_dir>/<flavour.dir>/`.
pub fn ensure_flavour(profile_dir: &Path, flavour: &Flavour<'_>) -> Result<PathBuf, String> {
    let staticlib = find_staticlib_of(profile_dir, flavour.staticlib)?;
    let out = profile_dir.join(flavour.dir);
    let a_time = mtime(&staticlib);
    let all = LIBRARIES
        .iter()
        .copied()
        .chain(flavour.companions.iter().map(|c| c.soname));
    let fresh = all.clone().all(|l| {
        let t = mtime(&out.join(l));
        t.is_some() && t >= a_time
    }) && std::fs::read_to_string(out.join("stamp")).ok()
        == Some(staticlib.display().to_string());
    if fresh {
        return Ok(out);
    }
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    // Private scratch names, then rename: concurrent builders (parallel tests) never
    // load a half-written library.
    let tag = format!("{}-{:?}", std::process::id(), std::thread::current().id())
        .replace(|c: char| !c.is_ascii_alphanumeric(), "");
    let scratch = out.join(format!(".build-{tag}"));
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let write = |name: &str, text: &str| -> Result<PathBuf, String> {
        let p = scratch.join(name);
        std::fs::write(&p, text).map_err(|e| format!("writing {}: {e}", p.display()))?;
        Ok(p)
    };
    let ibv_map = write(
        "libibverbs.map",
        &format!("{LIBIBVERBS_MAP}\n{}", flavour.extra_nodes),
    )?;
    run(cc()
        .arg("-shared")
        .arg("-o")
        .arg(scratch.join("libibverbs.so.1"))
        .arg("-Wl,-soname,libibverbs.so.1")
        .arg(format!("-Wl,--version-script={}", ibv_map.display()))
        .arg("-Wl,--gc-sections")
        .arg("-Wl,--whole-archive")
        .arg(&staticlib)
        .arg("-Wl,--no-whole-archive")
        // What `rustc --print native-static-libs` lists for a std staticlib on Linux.
        .args([
            "-lgcc_s",
            "-lutil",
            "-lrt",
            "-lpthread",
            "-lm",
            "-ldl",
            "-lc",
        ]))?;
    for (lib, c, map) in [
        ("libmlx5.so.1", MLX5_C, MLX5_MAP),
        ("libefa.so.1", EFA_C, EFA_MAP),
    ] {
        let stem = lib.trim_end_matches(".so.1");
        let c = write(&format!("{stem}.c"), c)?;
        let map = write(&format!("{stem}.map"), map)?;
        run(cc()
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
            .arg(scratch.join(lib))
            .arg(format!("-Wl,-soname,{lib}"))
            .arg(format!("-Wl,--version-script={}", map.display()))
            .arg(&c))?;
    }
    for c in flavour.companions {
        let stem = c.soname.trim_end_matches(".so.1");
        let src = write(&format!("{stem}.S"), c.asm)?;
        let map = write(&format!("{stem}.map"), c.map)?;
        run(cc()
            .args(["-shared", "-fPIC", "-o"])
            .arg(scratch.join(c.soname))
            .arg(format!("-Wl,-soname,{}", c.soname))
            .arg(format!("-Wl,--version-script={}", map.display()))
            .arg("-Wl,-z,defs")
            .arg(&src)
            .arg("-L")
            .arg(&scratch)
            .arg("-l:libibverbs.so.1"))?;
    }
    for lib in all {
        std::fs::rename(scratch.join(lib), out.join(lib))
            .map_err(|e| format!("installing {lib}: {e}"))?;
    }
    std::fs::write(out.join("stamp"), staticlib.display().to_string())
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(out)
}
