//! Store fields: typed, cheap `Arc` snapshots for readers, one writer per field (the node's
//! set of fields is [`crate::node`]).
//!
//! Every field is a `tokio::sync::watch` channel holding an `Arc<T>`. A [`Field`] is the only
//! writer of its value and is not `Clone`; [`Reader`]s are cloned freely. A write that leaves the
//! value equal to what it was wakes no one, so controllers that wake on changes never spin on
//! no-op updates, and a changed `Arc` pointer always means changed content.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::watch;

/// The single writer of one store field.
#[derive(Debug)]
pub struct Field<T> {
    tx: watch::Sender<Arc<T>>,
}

/// A reader of one store field: snapshots and change notifications.
#[derive(Debug)]
pub struct Reader<T> {
    rx: watch::Receiver<Arc<T>>,
}

impl<T> Clone for Reader<T> {
    fn clone(&self) -> Self {
        Reader {
            rx: self.rx.clone(),
        }
    }
}

impl<T: PartialEq + Send + Sync + 'static> Field<T> {
    pub fn new(initial: T) -> Field<T> {
        let (tx, _rx) = watch::channel(Arc::new(initial));
        Field { tx }
    }

    /// Replaces the value; returns whether it changed (and so whether readers were woken).
    pub fn set(&self, value: T) -> bool {
        self.tx.send_if_modified(|current| {
            if **current == value {
                false
            } else {
                *current = Arc::new(value);
                true
            }
        })
    }

    /// Edits a copy of the value and stores it if it differs. The read, edit and store happen
    /// under the channel's lock, so concurrent updates never overwrite each other's edits (a
    /// read-then-set would let two writers both start from the same old value). `edit` must
    /// not read this field's readers: it runs under the channel's lock.
    pub fn update(&self, edit: impl FnOnce(&mut T)) -> bool
    where
        T: Clone,
    {
        self.tx.send_if_modified(|current| {
            let mut value = T::clone(current);
            edit(&mut value);
            if **current == value {
                false
            } else {
                *current = Arc::new(value);
                true
            }
        })
    }

    pub fn get(&self) -> Arc<T> {
        self.tx.borrow().clone()
    }

    pub(crate) fn reader(&self) -> Reader<T> {
        Reader {
            rx: self.tx.subscribe(),
        }
    }
}

impl<T: Send + Sync + 'static> Reader<T> {
    /// The current snapshot; marks it as seen for [`Reader::changed`].
    pub fn get(&mut self) -> Arc<T> {
        self.rx.borrow_and_update().clone()
    }

    /// The current snapshot without touching the seen mark (for shared readers).
    pub fn peek(&self) -> Arc<T> {
        self.rx.borrow().clone()
    }

    /// Waits until the value changes after the last [`Reader::get`]. Never returns once the
    /// writer is gone (the daemon is shutting down; the shutdown signal wakes controllers).
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// A boxed wake source for the controller [`Driver`](crate::machinery::driver::Driver).
    pub(crate) fn trigger(&self) -> Box<dyn Trigger> {
        Box::new(self.clone())
    }
}

/// Something a controller wakes on: resolves when a watched value changed.
pub trait Trigger: Send {
    fn changed(&mut self) -> BoxFuture<'_, ()>;
    /// Forgets changes made so far (the driver looks at everything when it starts).
    fn mark_seen(&mut self);
}

impl<T: Send + Sync + 'static> Trigger for Reader<T> {
    fn changed(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            Reader::changed(self).await;
            // Mark the new value seen so the next call waits for the next change.
            self.rx.borrow_and_update();
        })
    }

    fn mark_seen(&mut self) {
        self.rx.borrow_and_update();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_that_changes_nothing_wakes_no_one() {
        let field = Field::new(1u32);
        let mut reader = field.reader();
        assert_eq!(*reader.get(), 1);
        assert!(!field.set(1));
        let woke =
            tokio::time::timeout(std::time::Duration::from_millis(20), reader.changed()).await;
        assert!(woke.is_err(), "an equal write must not wake readers");
        assert!(field.set(2));
        reader.changed().await;
        assert_eq!(*reader.get(), 2);
    }

    #[tokio::test]
    async fn update_edits_a_copy_and_keeps_old_snapshots_intact() {
        let field = Field::new(vec![1, 2]);
        let before = field.reader().get();
        assert!(field.update(|v| v.push(3)));
        assert_eq!(*before, vec![1, 2]);
        assert_eq!(*field.get(), vec![1, 2, 3]);
        assert!(!field.update(|_| {}));
    }

    /// Writers on several threads each add their own entries; none is lost (a read-clone-set
    /// update lost some in most runs).
    #[test]
    fn concurrent_updates_lose_nothing() {
        const THREADS: u64 = 4;
        const UPDATES: u64 = 500;
        let field = Arc::new(Field::new(std::collections::BTreeSet::<u64>::new()));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let field = field.clone();
                std::thread::spawn(move || {
                    for n in 0..UPDATES {
                        assert!(field.update(|set| {
                            set.insert(t * UPDATES + n);
                        }));
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        assert_eq!(field.get().len() as u64, THREADS * UPDATES);
    }
}
