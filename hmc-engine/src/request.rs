//! Asynchronous transfer requests: a handle with a status to poll and a wait.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::error::EngineError;

/// Where an asynchronous transfer stands.
#[derive(Clone, Debug)]
pub enum TransferStatus {
    /// Still moving bytes.
    Waiting,
    /// Every descriptor is done.
    Completed,
    /// Its timeout passed; the transport no longer touches its memory.
    TimedOut,
    /// It failed; nothing more will happen.
    Failed(Arc<EngineError>),
}

impl TransferStatus {
    /// Whether the transfer has ended (any status but `Waiting`).
    pub fn is_done(&self) -> bool {
        !matches!(self, TransferStatus::Waiting)
    }
}

/// A transfer started with [`crate::Engine::transfer_async`]. Dropping the handle does
/// not cancel the transfer: it runs to completion, to its timeout, or until
/// [`TransferRequest::cancel`].
#[derive(Clone)]
pub struct TransferRequest {
    status: Arc<Mutex<TransferStatus>>,
    done: watch::Receiver<bool>,
    cancel: Arc<tokio::sync::Notify>,
}

/// The engine's end of a request: reports its outcome once.
pub(crate) struct Completer {
    status: Arc<Mutex<TransferStatus>>,
    done: watch::Sender<bool>,
    /// Signalled by [`TransferRequest::cancel`] (a stored permit, so a cancel before the
    /// transfer starts waiting is not lost).
    pub(crate) cancel: Arc<tokio::sync::Notify>,
}

impl TransferRequest {
    pub(crate) fn new() -> (TransferRequest, Completer) {
        let status = Arc::new(Mutex::new(TransferStatus::Waiting));
        let (tx, rx) = watch::channel(false);
        let cancel = Arc::new(tokio::sync::Notify::new());
        (
            TransferRequest {
                status: status.clone(),
                done: rx,
                cancel: cancel.clone(),
            },
            Completer {
                status,
                done: tx,
                cancel,
            },
        )
    }

    /// Cancels the transfer if it is still running: it ends `Failed` with
    /// [`EngineError::Cancelled`], and once [`TransferRequest::wait`] reports that, the
    /// transport no longer touches its memory (bytes already moved stay moved). A request
    /// that already ended keeps its status.
    pub fn cancel(&self) {
        self.cancel.notify_one();
    }

    /// The status now.
    pub fn status(&self) -> TransferStatus {
        self.status.lock().clone()
    }

    /// Waits until the transfer ends and returns how.
    pub async fn wait(&self) -> TransferStatus {
        let mut rx = self.done.clone();
        // The sender is kept until it reports, so a closed channel also means "done".
        let _ = rx.wait_for(|d| *d).await;
        self.status()
    }
}

impl Completer {
    pub(crate) fn finish(self, status: TransferStatus) {
        *self.status.lock() = status;
        let _ = self.done.send(true);
    }
}
