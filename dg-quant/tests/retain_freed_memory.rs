//! `alloc::retain_freed_memory`, in a process of its own (the setting is process-wide) and
//! without the test harness (its threads would take allocator arenas before the setting): a
//! large buffer freed and allocated again reuses its pages instead of faulting in fresh ones,
//! on the main thread and on a thread started afterwards.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn minor_faults() -> i64 {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed value it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage.ru_minflt
    }
}

/// Faults taken by allocating and touching a 64 MiB buffer (16384 pages of 4 KiB).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn faults_of_a_fresh_buffer() -> i64 {
    let before = minor_faults();
    let v = std::hint::black_box(vec![1.0f32; 16 << 20]);
    let after = minor_faults();
    drop(v);
    after - before
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    // Without the setting, every such buffer is a fresh mapping.
    assert!(faults_of_a_fresh_buffer() > 4000);
    assert!(faults_of_a_fresh_buffer() > 4000);
    assert!(dg_quant::alloc::retain_freed_memory());
    faults_of_a_fresh_buffer();
    let again = faults_of_a_fresh_buffer();
    assert!(again < 1000, "{again} page faults for a reused buffer");
    let on_a_thread = std::thread::spawn(faults_of_a_fresh_buffer).join().unwrap();
    assert!(
        on_a_thread < 1000,
        "{on_a_thread} page faults on a new thread"
    );
    println!("retain_freed_memory: {again} and {on_a_thread} page faults for reused buffers");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {
    assert!(!dg_quant::alloc::retain_freed_memory());
}
