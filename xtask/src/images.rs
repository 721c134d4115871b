//! `cargo xtask images`: builds the docker tier's test image without a registry.
//!
//! `stockade-busybox:local` is a `docker import` of a root filesystem made from Debian's
//! `busybox-static`: `/bin/busybox` and its applet links, an `/etc/passwd` and `/etc/group`
//! that name root and nobody, empty `/proc`, `/sys`, `/dev`, and `/tmp` with mode 1777 (the
//! container's tmpfs takes the image's mode). Nothing is pulled. The escape suite imports its
//! own `FROM scratch`-style image of the static attack programs (`cargo xtask escape`).

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The image the docker tier uses by default.
pub(crate) const BUSYBOX_IMAGE: &str = "stockade-busybox:local";

pub(crate) fn run(target: &Path) -> Result<()> {
    let busybox = Path::new("/bin/busybox");
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "busybox-static"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"));
    if !installed {
        eprintln!("images: installing busybox-static");
        crate::run(Command::new("apt-get").args(["update", "-qq"]))?;
        crate::run(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends", "busybox-static"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    let rootfs = target.join("images/busybox-rootfs");
    let _ = fs::remove_dir_all(&rootfs);
    for d in ["bin", "etc", "proc", "sys", "dev", "tmp", "workspace"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    fs::copy(busybox, rootfs.join("bin/busybox")).context("copying /bin/busybox (busybox-static)")?;
    let list = Command::new(busybox).arg("--list").output()?;
    for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|a| !a.is_empty() && *a != "busybox") {
        symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    )?;
    fs::write(rootfs.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    let mut tar = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .args(["--owner=0", "--group=0", "-cf", "-", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("spawning tar")?;
    let stdout = tar.stdout.take().context("tar has no stdout")?;
    let previous = image_id(BUSYBOX_IMAGE);
    let imported = Command::new("docker")
        .args(["import", "-c", "CMD [\"/bin/sh\"]", "-", BUSYBOX_IMAGE])
        .stdin(stdout)
        .stdout(Stdio::null())
        .status()
        .context("running docker import (is a Docker engine reachable? see DOCKER_HOST)")?;
    if !tar.wait()?.success() || !imported.success() {
        bail!("docker import of {BUSYBOX_IMAGE} failed");
    }
    // A rebuild leaves the previous image untagged: remove it by its id (ours).
    if let Some(old) = previous.filter(|old| image_id(BUSYBOX_IMAGE).as_ref() != Some(old)) {
        let _ = Command::new("docker").args(["rmi", &old]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
    println!("images: built {BUSYBOX_IMAGE}");
    Ok(())
}

/// The id of the local image `name`, if it exists.
fn image_id(name: &str) -> Option<String> {
    let out = Command::new("docker").args(["image", "inspect", "-f", "{{.Id}}", name]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
