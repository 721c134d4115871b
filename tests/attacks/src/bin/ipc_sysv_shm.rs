//! Attach to a System V shared memory segment the host created.
//! Category ipc: System V IPC across the IPC namespace.
use stockade_attacks::*;

fn main() {
    let key = arg("shm_key").parse::<i64>().unwrap_or(0) as u64;
    match syscall(libc::SYS_shmget, [key, 0, 0o600, 0, 0, 0]) {
        Ok(id) => {
            println!("ATTEMPT shmget ok");
            report("shmat", syscall(libc::SYS_shmat, [id as u64, 0, libc::SHM_RDONLY as u64, 0, 0, 0]));
        }
        Err(e) => println!("ATTEMPT shmget {}", errno_name(&e)),
    }
}
