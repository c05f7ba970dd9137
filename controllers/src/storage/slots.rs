//! Which stored schedule a start takes: the storage dir keeps the schedule in force in two slot
//! files rewritten in place by turns (`<storage>/schedule.slot0`, `schedule.slot1`, each with a
//! sequence number and a checksum; written and read by `src/storage/slots.rs`) and, after each,
//! `schedule/schedule.json` for readers and verwalter 0.13. Only the slot is flushed before the
//! schedule is put in force, so after a crash `schedule.json` may lag a schedule behind (or be
//! torn, after a power loss) while a slot holds the newest; and a slot being rewritten may be
//! torn while the other holds the one before.
//!
//! The rules, given what the daemon found valid (checksum and schedule hash both right):
//!
//! - the valid slot with the higher sequence number is the newest stored schedule;
//! - `schedule.json` is taken instead only when it is neither slot's schedule and is newer by its
//!   timestamp: it was written by a version that knows no slots (a downgrade to 0.13 or an
//!   earlier verwalter that ran after this one);
//! - with no valid slot, `schedule.json` is taken as it is (a storage dir from before the slots);
//! - `schedule.json` is rewritten from the slot taken when it is not that slot's schedule, so
//!   readers and a later 0.13 see what is in force;
//! - the next write goes into the other slot than the newest valid one (never over the schedule
//!   a crash would fall back to), with the next sequence number.

/// A slot whose checksum and schedule hash are right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidSlot {
    pub seq: u64,
    /// The schedule's `timestamp`.
    pub timestamp: u64,
}

/// A `schedule.json` that parsed and whose hash is right.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValidJson {
    pub timestamp: u64,
    /// Whether its bytes are those of slot 0 and of slot 1 (the body a slot holds is exactly the
    /// `schedule.json` written with it).
    pub same_as: [bool; 2],
}

/// What a start found in the storage dir.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Found {
    pub slots: [Option<ValidSlot>; 2],
    pub json: Option<ValidJson>,
}

/// Which stored schedule is in force after the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    Slot(usize),
    Json,
    Nothing,
}

/// What a start does with what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadPlan {
    pub take: Take,
    /// Write the slot taken into `schedule.json` (it is missing, broken or another schedule).
    pub rewrite_json: bool,
    /// The next schedule saved goes into this slot...
    pub next_slot: usize,
    /// ...with this sequence number.
    pub next_seq: u64,
}

/// The newest valid slot, if any (the higher sequence number; slot 0 on a tie, which the
/// daemon never writes).
pub fn newest(slots: &[Option<ValidSlot>; 2]) -> Option<usize> {
    match slots {
        [Some(a), Some(b)] => Some(if b.seq > a.seq { 1 } else { 0 }),
        [Some(_), None] => Some(0),
        [None, Some(_)] => Some(1),
        [None, None] => None,
    }
}

/// Plans the start on what was found (see the module's rules).
pub fn plan_load(found: &Found) -> LoadPlan {
    let Some(slot) = newest(&found.slots) else {
        return LoadPlan {
            take: if found.json.is_some() {
                Take::Json
            } else {
                Take::Nothing
            },
            rewrite_json: false,
            next_slot: 0,
            next_seq: 1,
        };
    };
    let newest_slot = found.slots[slot].expect("newest is valid");
    let next_slot = 1 - slot;
    let next_seq = newest_slot.seq + 1;
    let json_is_newer = found.json.is_some_and(|json| {
        !json.same_as.contains(&true) && json.timestamp > newest_slot.timestamp
    });
    if json_is_newer {
        return LoadPlan {
            take: Take::Json,
            rewrite_json: false,
            next_slot,
            next_seq,
        };
    }
    LoadPlan {
        take: Take::Slot(slot),
        rewrite_json: !found.json.is_some_and(|json| json.same_as[slot]),
        next_slot,
        next_seq,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(seq: u64, timestamp: u64) -> Option<ValidSlot> {
        Some(ValidSlot { seq, timestamp })
    }

    fn json(timestamp: u64, same_as: [bool; 2]) -> Option<ValidJson> {
        Some(ValidJson { timestamp, same_as })
    }

    fn plan(slots: [Option<ValidSlot>; 2], json: Option<ValidJson>) -> LoadPlan {
        plan_load(&Found { slots, json })
    }

    #[test]
    fn the_slot_with_the_higher_sequence_wins_and_the_next_write_goes_into_the_other() {
        let p = plan([slot(7, 700), slot(8, 800)], json(800, [false, true]));
        assert_eq!(
            p,
            LoadPlan {
                take: Take::Slot(1),
                rewrite_json: false,
                next_slot: 0,
                next_seq: 9
            }
        );
        // An older sequence in slot 1 loses, whatever the timestamps say (a schedule taken
        // later may carry an older timestamp: another leader's clock).
        let p = plan([slot(12, 100), slot(11, 900)], json(100, [true, false]));
        assert_eq!((p.take, p.next_slot, p.next_seq), (Take::Slot(0), 1, 13));
        assert!(!p.rewrite_json);
    }

    /// A torn or corrupt slot is not valid (the daemon's checks): the other one is taken, and
    /// the broken one is the next written, so the good one is never overwritten.
    #[test]
    fn a_torn_slot_is_passed_over_and_written_next() {
        let p = plan([slot(4, 400), None], json(400, [true, false]));
        assert_eq!((p.take, p.next_slot, p.next_seq), (Take::Slot(0), 1, 5));
        let p = plan([None, slot(4, 400)], json(400, [false, true]));
        assert_eq!((p.take, p.next_slot, p.next_seq), (Take::Slot(1), 0, 5));
    }

    /// `schedule.json` a schedule behind (the crash came between the slot's flush and its own
    /// write), missing or broken: the slot is taken and `schedule.json` rewritten from it.
    #[test]
    fn a_slot_newer_than_schedule_json_is_taken_and_json_rewritten() {
        for json in [json(700, [true, false]), None] {
            let p = plan([slot(7, 700), slot(8, 800)], json);
            assert_eq!(p.take, Take::Slot(1));
            assert!(p.rewrite_json, "{json:?}");
        }
        // Neither slot's and older: one whose write failed, left behind.
        let p = plan([slot(7, 700), slot(8, 800)], json(600, [false, false]));
        assert_eq!(p.take, Take::Slot(1));
        assert!(p.rewrite_json);
    }

    /// A `schedule.json` that is neither slot's and newer was written by a version without
    /// slots after this one ran (0.13 after a downgrade): it is what was in force last.
    #[test]
    fn a_newer_schedule_json_of_another_version_wins_over_stale_slots() {
        let p = plan([slot(7, 700), slot(8, 800)], json(900, [false, false]));
        assert_eq!(
            p,
            LoadPlan {
                take: Take::Json,
                rewrite_json: false,
                next_slot: 0,
                next_seq: 9
            }
        );
    }

    /// A storage dir from before the slots (an upgrade) or 0.13's: `schedule.json` alone; an
    /// empty one: nothing. The first write goes into slot 0 with sequence 1.
    #[test]
    fn without_slots_schedule_json_is_taken_as_it_is() {
        let p = plan([None, None], json(5, [false, false]));
        assert_eq!(
            p,
            LoadPlan {
                take: Take::Json,
                rewrite_json: false,
                next_slot: 0,
                next_seq: 1
            }
        );
        assert_eq!(plan([None, None], None).take, Take::Nothing);
    }
}
