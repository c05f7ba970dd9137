//! Which subscription results go out: a GraphQL subscription (`/v1/graphql`) makes a result on
//! every change of the status sources, but a client hears only results that differ from the
//! last one it got for that subscription (a change to a field it did not select sends nothing).

use std::collections::HashMap;

/// The last result sent per subscription id of one connection.
#[derive(Debug, Default)]
pub struct LastSent {
    sent: HashMap<String, String>,
}

impl LastSent {
    /// Whether `payload` (a result's JSON text) for subscription `id` is to be sent: not when it
    /// equals the last one sent for `id`. Remembers it.
    pub fn fresh(&mut self, id: &str, payload: &str) -> bool {
        if self.sent.get(id).is_some_and(|last| last == payload) {
            return false;
        }
        self.sent.insert(id.to_string(), payload.to_string());
        true
    }

    /// Subscription `id` ended: a new one under the same id starts over.
    pub fn forget(&mut self, id: &str) {
        self.sent.remove(id);
    }

    /// Subscriptions remembered.
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_result_is_not_sent_again() {
        let mut last = LastSent::default();
        assert!(last.fresh("1", r#"{"epoch":1}"#));
        assert!(!last.fresh("1", r#"{"epoch":1}"#), "the same result again");
        assert!(last.fresh("2", r#"{"epoch":1}"#), "another subscription");
        assert!(last.fresh("1", r#"{"epoch":2}"#), "a new result");
        assert!(!last.fresh("1", r#"{"epoch":2}"#));
        last.forget("1");
        assert!(
            last.fresh("1", r#"{"epoch":2}"#),
            "a completed id starts over"
        );
        assert_eq!(last.len(), 2);
    }
}
