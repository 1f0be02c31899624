//! Held reads: acquiring a hold (judged like a get) and releasing one, including another
//! client's or one that does not exist.

use super::model;
use super::{Harness, client_id, client_index, expect_code, key_name};
use crate::error::ErrorCode;
use crate::ids::HoldId;

impl Harness {
    pub(super) fn hold(&mut self, client: u8, key: u8) -> Result<(), String> {
        let (id, key) = (client_id(client), key_name(key));
        let got = self.master.acquire_hold(id, &key, self.now);
        self.model.touch(id, self.now);
        self.no_events("hold")?;
        match self.expected_read(&key) {
            Err(code) => expect_code(&got, code, "hold"),
            Ok(_) => {
                let (hold, list) = got.map_err(|e| format!("hold failed: {e}"))?;
                self.hit("hold");
                self.judge_list(&key, &list)?;
                let object = self.model.objects.get_mut(&key).expect("exists");
                object.holds += 1;
                let write_id = object.write_id;
                self.model.holds.insert(
                    hold,
                    model::MHold {
                        client: id,
                        key,
                        write_id,
                    },
                );
                self.clients[client_index(id)].holds.push(hold);
                Ok(())
            }
        }
    }

    pub(super) fn release(&mut self, client: u8, hold: u8, foreign: bool) -> Result<(), String> {
        let id = client_id(client);
        let owner = if foreign {
            client_id(client.wrapping_add(1))
        } else {
            id
        };
        let side = &self.clients[client_index(owner)];
        let pick = (!side.holds.is_empty()).then(|| usize::from(hold) % side.holds.len());
        let hold_id = pick.map_or(HoldId(u64::MAX), |i| side.holds[i]);
        let got = self.master.release_hold(id, hold_id, self.now);
        self.model.touch(id, self.now);
        self.no_events("release")?;
        let Some(i) = pick else {
            return expect_code(&got, ErrorCode::INVALID_PARAMS, "release of no hold");
        };
        if owner != id {
            return expect_code(
                &got,
                ErrorCode::ILLEGAL_CLIENT,
                "release of another client's hold",
            );
        }
        got.map_err(|e| format!("release failed: {e}"))?;
        self.clients[client_index(id)].holds.remove(i);
        let held = self
            .model
            .holds
            .remove(&hold_id)
            .expect("model knows the hold");
        if let Some(o) = self.model.objects.get_mut(&held.key)
            && o.write_id == held.write_id
        {
            o.holds -= 1;
        }
        Ok(())
    }
}
