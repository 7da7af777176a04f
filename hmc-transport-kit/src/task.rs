//! Tasks that stop when their owner drops: a transport's responder or progress task must not outlive the communicator that spawned it.

/// A tokio task aborted when this handle drops.
#[derive(Debug)]
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    /// Spawns `fut` on the current runtime.
    pub fn spawn<F>(fut: F) -> Self
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        AbortOnDrop(tokio::spawn(fut))
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn dropping_the_handle_stops_the_task() {
        let ran_to_end = Arc::new(AtomicBool::new(false));
        let flag = ran_to_end.clone();
        let t = AbortOnDrop::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            flag.store(true, Ordering::SeqCst);
        });
        drop(t);
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        assert!(!ran_to_end.load(Ordering::SeqCst));
    }
}
