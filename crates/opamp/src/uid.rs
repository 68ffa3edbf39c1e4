//! Agent instance uids: 16 bytes on the wire since spec v0.10 (a UUID, v7
//! recommended), shown as canonical UUID text (`OpAMP-Instance-UID` header, the
//! `id` in `/admin/agents`).
//!
//! Clients written against the older text of the spec sent a 26-character ULID
//! *string* in the same field (wire type 2 either way), and opamp-go's example server
//! still accepts those; so does [`InstanceUid::from_wire`], which remembers the form
//! so that a new uid handed to such a client is written the way it reads them.

use std::fmt;

use crate::error::{Error, Result};

/// One agent instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceUid([u8; 16]);

/// How a client wrote its uid in `AgentToServer.instance_uid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireForm {
    /// 16 raw bytes: the spec since v0.10, both registry clients.
    Bytes,
    /// 36 characters of UUID text.
    UuidText,
    /// 26 characters of ULID text (the spec before v0.10).
    UlidText,
}

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

impl InstanceUid {
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        InstanceUid(bytes)
    }

    /// Reads `AgentToServer.instance_uid`.
    pub fn from_wire(bytes: &[u8]) -> Result<(Self, WireForm)> {
        if let Ok(raw) = <[u8; 16]>::try_from(bytes) {
            return Ok((InstanceUid(raw), WireForm::Bytes));
        }
        let bad = || Error::InstanceUid { len: bytes.len() };
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        match text.len() {
            36 => Ok((Self::parse(text).map_err(|_| bad())?, WireForm::UuidText)),
            26 => Ok((parse_ulid(text).ok_or_else(bad)?, WireForm::UlidText)),
            _ => Err(bad()),
        }
    }

    /// Writes the uid the way a client of `form` reads it.
    pub fn to_wire(self, form: WireForm) -> Vec<u8> {
        match form {
            WireForm::Bytes => self.0.to_vec(),
            WireForm::UuidText => self.to_string().into_bytes(),
            WireForm::UlidText => ulid_text(self.0).into_bytes(),
        }
    }

    /// Parses canonical UUID text (any case, with hyphens).
    pub fn parse(text: &str) -> Result<Self> {
        let uuid = uuid::Uuid::try_parse(text.trim())
            .map_err(|_| Error::InstanceUidText(text.to_owned()))?;
        Ok(InstanceUid(uuid.into_bytes()))
    }

    /// A fresh uid (UUIDv7) for an agent that asked for one or whose uid is taken.
    pub fn new_v7() -> Self {
        InstanceUid(uuid::Uuid::now_v7().into_bytes())
    }

    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for InstanceUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        uuid::Uuid::from_bytes(self.0).hyphenated().fmt(f)
    }
}

fn parse_ulid(text: &str) -> Option<InstanceUid> {
    let mut value: u128 = 0;
    for (i, c) in text.bytes().enumerate() {
        let digit = CROCKFORD
            .iter()
            .position(|&d| d == c.to_ascii_uppercase())? as u128;
        // 26 digits carry 130 bits; the first may use only 3 of its 5.
        if i == 0 && digit > 7 {
            return None;
        }
        value = (value << 5) | digit;
    }
    Some(InstanceUid(value.to_be_bytes()))
}

fn ulid_text(bytes: [u8; 16]) -> String {
    let value = u128::from_be_bytes(bytes);
    (0..26)
        .rev()
        .map(|i| CROCKFORD[((value >> (i * 5)) & 0x1f) as usize] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_bytes_are_the_uid() {
        let raw = [
            0x01, 0x90, 0xf8, 0xa2, 0x7b, 0x1c, 0x7d, 0xef, 0x8a, 0, 0x12, 0x34, 0x56, 0x78, 0x90,
            0xab,
        ];
        let (uid, form) = InstanceUid::from_wire(&raw).unwrap();
        assert_eq!(form, WireForm::Bytes);
        assert_eq!(uid.to_string(), "0190f8a2-7b1c-7def-8a00-1234567890ab");
        assert_eq!(uid.to_wire(WireForm::Bytes), raw);
        assert_eq!(
            InstanceUid::parse("0190F8A2-7B1C-7DEF-8A00-1234567890AB").unwrap(),
            uid
        );
    }

    #[test]
    fn old_clients_text_forms_are_read_and_written_back_alike() {
        let (uid, form) = InstanceUid::from_wire(b"0190f8a2-7b1c-7def-8a00-1234567890ab").unwrap();
        assert_eq!(form, WireForm::UuidText);
        assert_eq!(uid.to_wire(form), b"0190f8a2-7b1c-7def-8a00-1234567890ab");

        // The ULID spec's own example.
        let (uid, form) = InstanceUid::from_wire(b"01ARZ3NDEKTSV4RRFFQ69G5FAV").unwrap();
        assert_eq!(form, WireForm::UlidText);
        assert_eq!(uid.to_string(), "01563e3a-b5d3-d676-4c61-efb99302bd5b");
        assert_eq!(uid.to_wire(form), b"01ARZ3NDEKTSV4RRFFQ69G5FAV");
        // Lower case reads the same.
        assert_eq!(
            InstanceUid::from_wire(b"01arz3ndektsv4rrffq69g5fav")
                .unwrap()
                .0,
            uid
        );
    }

    #[test]
    fn anything_else_is_refused_with_its_length() {
        for bad in [
            &b""[..],
            &[1u8; 15][..],
            &[1u8; 17][..],
            b"81ARZ3NDEKTSV4RRFFQ69G5FAV", // 130 bits do not fit
            b"01ARZ3NDEKTSV4RRFFQ69G5FAU", // U is not Crockford
            b"0190f8a2-7b1c-7def-8a00-1234567890zz",
        ] {
            let err = InstanceUid::from_wire(bad).unwrap_err();
            assert!(
                err.to_string().contains(&format!("{} bytes", bad.len())),
                "{err}"
            );
        }
        assert!(InstanceUid::parse("nope").is_err());
    }

    #[test]
    fn new_uids_are_v7_and_distinct() {
        let a = InstanceUid::new_v7();
        let b = InstanceUid::new_v7();
        assert_ne!(a, b);
        assert_eq!(a.as_bytes()[6] >> 4, 7);
    }
}
