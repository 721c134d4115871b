//! Serde representation of captured bytes: a JSON string when the bytes are UTF-8, else an
//! array of byte values. Reports stay readable, and no byte is lost or replaced.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Repr<'a> {
    Text(std::borrow::Cow<'a, str>),
    Raw(Vec<u8>),
}

pub(crate) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Repr::Text(text.into()).serialize(s),
        Err(_) => Repr::Raw(bytes.to_vec()).serialize(s),
    }
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    Ok(match Repr::deserialize(d)? {
        Repr::Text(text) => text.into_owned().into_bytes(),
        Repr::Raw(bytes) => bytes,
    })
}
