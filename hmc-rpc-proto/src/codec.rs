//! `RpcCodec`: the deterministic big-endian serde data format of HMC RPC payloads.
//!
//! Field by field in declaration order, never a copy of Rust memory: integers fixed width
//! big-endian; `bool` one byte (0/1); `char` as `u32`; strings and byte strings a `u32`
//! length then the bytes (strings valid UTF-8); sequences, tuples-of-unknown-length and
//! maps a `u32` count then the items (use `BTreeMap` for a deterministic order); `Option`
//! one tag byte (0 none, 1 some); unit and unit structs nothing; enums a `u32` variant
//! index then the content; structs and tuples their fields in order, no count.
//!
//! Decoding checks every length against the bytes that remain before allocating, refuses
//! trailing bytes and repeated map keys, and limits nesting to [`RpcCodec::MAX_DEPTH`]. A consequence worth
//! knowing: a sequence count may not exceed the remaining bytes, so a sequence of
//! zero-sized elements (`Vec<()>`) longer than the rest of the payload is refused.

use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};
use serde::{Deserialize, Serialize, ser};

/// Why a value could not be encoded or decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Input ended before the value did.
    #[error("payload truncated: needed {needed} more bytes at offset {offset}, {remaining} remain")]
    Truncated {
        /// Where decoding stood.
        offset: usize,
        /// Bytes the next item needs.
        needed: u64,
        /// Bytes left.
        remaining: usize,
    },
    /// A `bool` byte other than 0 or 1.
    #[error("invalid bool byte {0} (expected 0 or 1)")]
    BadBool(u8),
    /// An `Option` tag other than 0 or 1.
    #[error("invalid option tag {0} (expected 0 or 1)")]
    BadOptionTag(u8),
    /// A string that is not UTF-8.
    #[error("string is not valid UTF-8: {0}")]
    BadUtf8(String),
    /// A `char` that is not a Unicode scalar value.
    #[error("invalid char {0:#x}")]
    BadChar(u32),
    /// A map repeats a key (each key may appear once, so that decoding is canonical).
    #[error("map key at offset {0} repeats an earlier key")]
    DuplicateMapKey(usize),
    /// Bytes left after the value.
    #[error("{0} trailing bytes after the value; sender and receiver disagree on the type")]
    TrailingBytes(usize),
    /// A length over `u32::MAX` when encoding.
    #[error("length {0} does not fit the u32 length prefix")]
    TooLong(usize),
    /// Nesting deeper than [`RpcCodec::MAX_DEPTH`].
    #[error("nesting deeper than {0} levels")]
    TooDeep(usize),
    /// The type cannot be expressed in this non-self-describing format.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// A message from the type's own `Serialize`/`Deserialize`.
    #[error("{0}")]
    Custom(String),
}

impl ser::Error for CodecError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        CodecError::Custom(msg.to_string())
    }
}

impl de::Error for CodecError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        CodecError::Custom(msg.to_string())
    }
}

impl From<CodecError> for hmc_core::Error {
    fn from(e: CodecError) -> Self {
        hmc_core::Error::InvalidArgument(format!("RpcCodec: {e}"))
    }
}

/// The codec's entry points.
///
/// # What to know before using it for an API
///
/// - **Byte fields.** serde gives this codec a `Vec<u8>` or `[u8]` field as a sequence of
///   `u8`s, each a serde call. A field marked `#[serde(with = "serde_bytes")]`, a
///   `serde_bytes::ByteBuf`, or a `bytes::Bytes` (feature `serde` of `bytes`) arrives as
///   one byte string and is copied at once. The encoding is the same (a `u32` length,
///   then the bytes), so either side may switch without the other noticing.
/// - **No type tag.** The format is not self-describing and carries no type name or
///   schema id: which type a payload holds is known only from the method id it came
///   with. Decoding refuses truncated payloads and trailing bytes
///   ([`CodecError::TrailingBytes`]), which catches most mismatched types, but two types
///   of the same layout decode as each other. When a type's shape changes, give its
///   method a new id, or lead the type with a version field that the receiver checks.
pub struct RpcCodec;

impl RpcCodec {
    /// Deepest nesting accepted when decoding.
    pub const MAX_DEPTH: usize = 128;

    /// Encodes `value`.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
        let mut out = Vec::new();
        Self::encode_into(&mut out, value)?;
        Ok(out)
    }

    /// Appends the encoding of `value` to `out`.
    pub fn encode_into<T: Serialize + ?Sized>(
        out: &mut Vec<u8>,
        value: &T,
    ) -> Result<(), CodecError> {
        value.serialize(&mut Encoder { out })
    }

    /// Decodes a whole payload as a `T`; trailing bytes are an error.
    pub fn decode<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, CodecError> {
        let mut d = Decoder {
            input: bytes,
            pos: 0,
            depth: 0,
        };
        let v = T::deserialize(&mut d)?;
        let rest = bytes.len() - d.pos;
        if rest != 0 {
            return Err(CodecError::TrailingBytes(rest));
        }
        Ok(v)
    }
}

// ---------------------------------------------------------------------------------------
// Encoder
// ---------------------------------------------------------------------------------------

struct Encoder<'a> {
    out: &'a mut Vec<u8>,
}

impl Encoder<'_> {
    fn len(&mut self, n: usize) -> Result<(), CodecError> {
        let n = u32::try_from(n).map_err(|_| CodecError::TooLong(n))?;
        self.out.extend_from_slice(&n.to_be_bytes());
        Ok(())
    }
}

macro_rules! ser_num {
    ($($f:ident: $t:ty),*) => {$(
        fn $f(self, v: $t) -> Result<(), CodecError> {
            self.out.extend_from_slice(&v.to_be_bytes());
            Ok(())
        }
    )*};
}

impl<'a, 'b> ser::Serializer for &'a mut Encoder<'b> {
    type Ok = ();
    type Error = CodecError;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    ser_num!(serialize_i8: i8, serialize_i16: i16, serialize_i32: i32, serialize_i64: i64,
        serialize_i128: i128, serialize_u8: u8, serialize_u16: u16, serialize_u32: u32,
        serialize_u64: u64, serialize_u128: u128, serialize_f32: f32, serialize_f64: f64);

    fn serialize_bool(self, v: bool) -> Result<(), CodecError> {
        self.out.push(v as u8);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), CodecError> {
        self.serialize_u32(v as u32)
    }
    fn serialize_str(self, v: &str) -> Result<(), CodecError> {
        self.serialize_bytes(v.as_bytes())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), CodecError> {
        self.len(v.len())?;
        self.out.extend_from_slice(v);
        Ok(())
    }
    fn serialize_none(self) -> Result<(), CodecError> {
        self.out.push(0);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<(), CodecError> {
        self.out.push(1);
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), CodecError> {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<(), CodecError> {
        Ok(())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        idx: u32,
        _: &'static str,
    ) -> Result<(), CodecError> {
        self.serialize_u32(idx)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<(), CodecError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        idx: u32,
        _: &'static str,
        v: &T,
    ) -> Result<(), CodecError> {
        self.serialize_u32(idx)?;
        v.serialize(self)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Self, CodecError> {
        let len = len.ok_or(CodecError::Unsupported("sequences of unknown length"))?;
        self.len(len)?;
        Ok(self)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, CodecError> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, CodecError> {
        Ok(self)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        idx: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self, CodecError> {
        self.serialize_u32(idx)?;
        Ok(self)
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Self, CodecError> {
        let len = len.ok_or(CodecError::Unsupported("maps of unknown length"))?;
        self.len(len)?;
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, CodecError> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        name: &'static str,
        idx: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<Self, CodecError> {
        // As a tuple variant: the variant's index, then the fields by position.
        self.serialize_tuple_variant(name, idx, variant, len)
    }
    fn is_human_readable(&self) -> bool {
        false
    }
}

macro_rules! ser_compound {
    ($tr:ident, $m:ident) => {
        impl<'a, 'b> ser::$tr for &'a mut Encoder<'b> {
            type Ok = ();
            type Error = CodecError;
            fn $m<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CodecError> {
                v.serialize(&mut **self)
            }
            fn end(self) -> Result<(), CodecError> {
                Ok(())
            }
        }
    };
}
ser_compound!(SerializeSeq, serialize_element);
ser_compound!(SerializeTuple, serialize_element);
ser_compound!(SerializeTupleStruct, serialize_field);
ser_compound!(SerializeTupleVariant, serialize_field);

impl<'a, 'b> ser::SerializeMap for &'a mut Encoder<'b> {
    type Ok = ();
    type Error = CodecError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), CodecError> {
        k.serialize(&mut **self)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), CodecError> {
        v.serialize(&mut **self)
    }
    fn end(self) -> Result<(), CodecError> {
        Ok(())
    }
}

// A struct's fields go by position: their names are not on the wire.
macro_rules! ser_named_fields {
    ($tr:ident) => {
        impl<'a, 'b> ser::$tr for &'a mut Encoder<'b> {
            type Ok = ();
            type Error = CodecError;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                _: &'static str,
                v: &T,
            ) -> Result<(), CodecError> {
                v.serialize(&mut **self)
            }
            fn end(self) -> Result<(), CodecError> {
                Ok(())
            }
        }
    };
}
ser_named_fields!(SerializeStruct);
ser_named_fields!(SerializeStructVariant);

// ---------------------------------------------------------------------------------------
// Decoder
// ---------------------------------------------------------------------------------------

struct Decoder<'de> {
    input: &'de [u8],
    pos: usize,
    depth: usize,
}

impl<'de> Decoder<'de> {
    fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    fn take(&mut self, n: u64) -> Result<&'de [u8], CodecError> {
        if n > self.remaining() as u64 {
            return Err(CodecError::Truncated {
                offset: self.pos,
                needed: n,
                remaining: self.remaining(),
            });
        }
        let n = n as usize;
        let s = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        Ok(self.take(N as u64)?.try_into().expect("exact length"))
    }

    fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    /// A count of items, each of which needs at least one byte.
    fn count(&mut self) -> Result<usize, CodecError> {
        let n = self.u32()?;
        if n as usize > self.remaining() {
            return Err(CodecError::Truncated {
                offset: self.pos,
                needed: u64::from(n),
                remaining: self.remaining(),
            });
        }
        Ok(n as usize)
    }

    fn bytes(&mut self) -> Result<&'de [u8], CodecError> {
        let n = self.u32()?;
        self.take(u64::from(n))
    }

    fn tag(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    fn nest<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, CodecError>,
    ) -> Result<T, CodecError> {
        if self.depth >= RpcCodec::MAX_DEPTH {
            return Err(CodecError::TooDeep(RpcCodec::MAX_DEPTH));
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }
}

macro_rules! de_num {
    ($($f:ident: $t:ty => $v:ident),*) => {$(
        fn $f<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
            visitor.$v(<$t>::from_be_bytes(self.array()?))
        }
    )*};
}

impl<'de> de::Deserializer<'de> for &mut Decoder<'de> {
    type Error = CodecError;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, CodecError> {
        Err(CodecError::Unsupported(
            "self-describing types (serde_json::Value, untagged enums, flatten)",
        ))
    }

    de_num!(deserialize_i8: i8 => visit_i8, deserialize_i16: i16 => visit_i16,
        deserialize_i32: i32 => visit_i32, deserialize_i64: i64 => visit_i64,
        deserialize_i128: i128 => visit_i128, deserialize_u8: u8 => visit_u8,
        deserialize_u16: u16 => visit_u16, deserialize_u32: u32 => visit_u32,
        deserialize_u64: u64 => visit_u64, deserialize_u128: u128 => visit_u128,
        deserialize_f32: f32 => visit_f32, deserialize_f64: f64 => visit_f64);

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        match self.tag()? {
            0 => visitor.visit_bool(false),
            1 => visitor.visit_bool(true),
            b => Err(CodecError::BadBool(b)),
        }
    }
    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        let v = self.u32()?;
        visitor.visit_char(char::from_u32(v).ok_or(CodecError::BadChar(v))?)
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        let b = self.bytes()?;
        let s = std::str::from_utf8(b).map_err(|e| CodecError::BadUtf8(e.to_string()))?;
        visitor.visit_borrowed_str(s)
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        self.deserialize_str(visitor)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        visitor.visit_borrowed_bytes(self.bytes()?)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        self.deserialize_bytes(visitor)
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        match self.tag()? {
            0 => visitor.visit_none(),
            1 => self.nest(|d| visitor.visit_some(d)),
            t => Err(CodecError::BadOptionTag(t)),
        }
    }
    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        visitor.visit_unit()
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, CodecError> {
        visitor.visit_unit()
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value, CodecError> {
        self.nest(|d| visitor.visit_newtype_struct(d))
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        // A sequence is a tuple whose length is on the wire.
        let n = self.count()?;
        self.deserialize_tuple(n, visitor)
    }
    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, CodecError> {
        self.nest(|d| {
            visitor.visit_seq(Items {
                d,
                left: len,
                keys: None,
            })
        })
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, CodecError> {
        self.deserialize_tuple(len, visitor)
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, CodecError> {
        let n = self.count()?;
        self.nest(|d| {
            visitor.visit_map(Items {
                d,
                left: n,
                keys: Some(Default::default()),
            })
        })
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, CodecError> {
        self.deserialize_tuple(fields.len(), visitor)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, CodecError> {
        self.nest(|d| visitor.visit_enum(d))
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, _: V) -> Result<V::Value, CodecError> {
        Err(CodecError::Unsupported(
            "identifiers (field names are not encoded)",
        ))
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, CodecError> {
        Err(CodecError::Unsupported("skipping unknown fields"))
    }
    fn is_human_readable(&self) -> bool {
        false
    }
}

struct Items<'a, 'de> {
    d: &'a mut Decoder<'de>,
    left: usize,
    /// Encoded keys seen so far (maps only): equal keys encode to equal bytes.
    keys: Option<std::collections::HashSet<&'de [u8]>>,
}

impl Items<'_, '_> {
    /// Counts off the next item: false when none is left.
    #[inline]
    fn count_off(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }

    /// Never more than the bytes that remain: a forged count cannot reserve memory.
    #[inline]
    fn hint(&self) -> Option<usize> {
        Some(self.left.min(self.d.remaining()))
    }
}

impl<'de> de::SeqAccess<'de> for Items<'_, 'de> {
    type Error = CodecError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, CodecError> {
        if !self.count_off() {
            return Ok(None);
        }
        seed.deserialize(&mut *self.d).map(Some)
    }
    fn size_hint(&self) -> Option<usize> {
        self.hint()
    }
}

impl<'de> de::MapAccess<'de> for Items<'_, 'de> {
    type Error = CodecError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, CodecError> {
        if !self.count_off() {
            return Ok(None);
        }
        let start = self.d.pos;
        let k = seed.deserialize(&mut *self.d)?;
        let input: &'de [u8] = self.d.input;
        if let Some(keys) = self.keys.as_mut()
            && !keys.insert(&input[start..self.d.pos])
        {
            return Err(CodecError::DuplicateMapKey(start));
        }
        Ok(Some(k))
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, CodecError> {
        seed.deserialize(&mut *self.d)
    }
    fn size_hint(&self) -> Option<usize> {
        self.hint()
    }
}

impl<'de> de::EnumAccess<'de> for &mut Decoder<'de> {
    type Error = CodecError;
    type Variant = Self;
    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self), CodecError> {
        let idx = self.u32()?;
        let v = seed.deserialize(idx.into_deserializer())?;
        Ok((v, self))
    }
}

impl<'de> de::VariantAccess<'de> for &mut Decoder<'de> {
    type Error = CodecError;
    fn unit_variant(self) -> Result<(), CodecError> {
        Ok(())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, CodecError> {
        seed.deserialize(self)
    }
    fn tuple_variant<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, CodecError> {
        de::Deserializer::deserialize_tuple(self, len, visitor)
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, CodecError> {
        de::Deserializer::deserialize_tuple(self, fields.len(), visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use serde::{Deserialize, Serialize};
    use std::collections::BTreeMap;

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Inner {
        name: String,
        values: Vec<i64>,
        flag: bool,
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    enum Shape {
        Empty,
        Circle(f64),
        Rect { w: u32, h: u32 },
        Pair(u8, Option<String>),
    }

    #[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
    struct Outer {
        id: u64,
        inner: Inner,
        shapes: Vec<Shape>,
        map: BTreeMap<String, Vec<u8>>,
        maybe: Option<Box<Outer>>,
        #[serde(with = "serde_bytes_compat")]
        blob: Vec<u8>,
        ch: char,
        tuple: (i8, u16, i128),
    }

    /// Byte strings through `serialize_bytes` without the serde_bytes crate.
    mod serde_bytes_compat {
        use serde::{Deserializer, Serializer, de::Visitor};
        pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(v)
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Vec<u8>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                    Ok(v.to_vec())
                }
            }
            d.deserialize_bytes(V)
        }
    }

    fn outer() -> Outer {
        let mut map = BTreeMap::new();
        map.insert("b".to_string(), vec![1, 2]);
        map.insert("a".to_string(), vec![]);
        Outer {
            id: 42,
            inner: Inner {
                name: "héllo".into(),
                values: vec![-1, 0, i64::MAX],
                flag: true,
            },
            shapes: vec![
                Shape::Empty,
                Shape::Circle(1.5),
                Shape::Rect { w: 3, h: 4 },
                Shape::Pair(7, Some("x".into())),
                Shape::Pair(8, None),
            ],
            map,
            maybe: Some(Box::new(Outer {
                id: 1,
                inner: Inner {
                    name: String::new(),
                    values: vec![],
                    flag: false,
                },
                shapes: vec![],
                map: BTreeMap::new(),
                maybe: None,
                blob: vec![],
                ch: 'z',
                tuple: (0, 0, 0),
            })),
            blob: vec![0xde, 0xad],
            ch: '€',
            tuple: (
                -2,
                65535,
                -170_141_183_460_469_231_731_687_303_715_884_105_728,
            ),
        }
    }

    #[test]
    fn nested_struct_round_trips() {
        let v = outer();
        let b = RpcCodec::encode(&v).unwrap();
        assert_eq!(RpcCodec::decode::<Outer>(&b).unwrap(), v);
    }

    #[rstest]
    #[case::u32(&RpcCodec::encode(&0x0102_0304u32).unwrap(), &[1, 2, 3, 4])]
    #[case::i16(&RpcCodec::encode(&-2i16).unwrap(), &[0xff, 0xfe])]
    #[case::string(&RpcCodec::encode("hi").unwrap(), &[0, 0, 0, 2, b'h', b'i'])]
    #[case::option_some(&RpcCodec::encode(&Some(true)).unwrap(), &[1, 1])]
    #[case::option_none(&RpcCodec::encode(&None::<u8>).unwrap(), &[0])]
    #[case::vec(&RpcCodec::encode(&vec![1u16, 2]).unwrap(), &[0, 0, 0, 2, 0, 1, 0, 2])]
    #[case::enum_unit(&RpcCodec::encode(&Shape::Empty).unwrap(), &[0, 0, 0, 0])]
    #[case::enum_struct(&RpcCodec::encode(&Shape::Rect { w: 1, h: 2 }).unwrap(), &[0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2])]
    fn encoding_is_byte_exact_big_endian(#[case] got: &[u8], #[case] want: &[u8]) {
        assert_eq!(got, want);
    }

    #[rstest]
    #[case::bool_(vec![true, false])]
    #[case::empty(Vec::<bool>::new())]
    fn bools_round_trip(#[case] v: Vec<bool>) {
        assert_eq!(
            RpcCodec::decode::<Vec<bool>>(&RpcCodec::encode(&v).unwrap()).unwrap(),
            v
        );
    }

    #[rstest]
    #[case::map({ let mut m = BTreeMap::new(); m.insert(3u32, "c".to_string()); m.insert(1, "a".into()); m })]
    #[case::empty_map(BTreeMap::new())]
    fn maps_round_trip_in_key_order(#[case] m: BTreeMap<u32, String>) {
        let b = RpcCodec::encode(&m).unwrap();
        assert_eq!(RpcCodec::decode::<BTreeMap<u32, String>>(&b).unwrap(), m);
        if m.len() == 2 {
            assert_eq!(&b[4..8], &[0, 0, 0, 1], "smallest key first");
        }
    }

    #[rstest]
    #[case::bad_bool(&[2], "invalid bool")]
    fn bad_bool_is_refused(#[case] b: &[u8], #[case] why: &str) {
        let e = RpcCodec::decode::<bool>(b).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }

    #[test]
    fn malformed_payloads_are_refused_with_reasons() {
        assert_eq!(
            RpcCodec::decode::<Option<u8>>(&[7, 1]),
            Err(CodecError::BadOptionTag(7))
        );
        assert!(matches!(
            RpcCodec::decode::<String>(&[0, 0, 0, 2, 0xff, 0xfe]),
            Err(CodecError::BadUtf8(_))
        ));
        assert!(matches!(
            RpcCodec::decode::<String>(&[0, 0, 0, 9, b'a']),
            Err(CodecError::Truncated { needed: 9, .. })
        ));
        // A huge count is refused before anything is reserved.
        assert!(matches!(
            RpcCodec::decode::<Vec<u64>>(&[0xff, 0xff, 0xff, 0xff, 0]),
            Err(CodecError::Truncated { .. })
        ));
        assert!(matches!(
            RpcCodec::decode::<BTreeMap<u8, u8>>(&[0x7f, 0xff, 0xff, 0xff]),
            Err(CodecError::Truncated { .. })
        ));
        assert_eq!(
            RpcCodec::decode::<u8>(&[1, 2]),
            Err(CodecError::TrailingBytes(1))
        );
        // Found by the codec fuzz target: a repeated key would silently collapse.
        assert_eq!(
            RpcCodec::decode::<BTreeMap<u8, u8>>(&[0, 0, 0, 2, 7, 1, 7, 2]),
            Err(CodecError::DuplicateMapKey(6))
        );
        assert!(matches!(
            RpcCodec::decode::<u32>(&[1, 2]),
            Err(CodecError::Truncated { .. })
        ));
        assert_eq!(
            RpcCodec::decode::<char>(&[0, 0, 0xd8, 0]),
            Err(CodecError::BadChar(0xd800))
        );
        assert!(RpcCodec::decode::<Shape>(&[0, 0, 0, 9]).is_err());
    }

    #[test]
    fn every_truncation_of_a_valid_payload_is_an_error_not_a_panic() {
        let b = RpcCodec::encode(&outer()).unwrap();
        for n in 0..b.len() {
            assert!(RpcCodec::decode::<Outer>(&b[..n]).is_err(), "prefix {n}");
        }
    }

    #[test]
    fn deep_nesting_is_refused() {
        #[derive(Deserialize, Debug)]
        #[allow(dead_code)]
        struct Rec(Option<Box<Rec>>);
        let b = vec![1u8; 10_000];
        assert_eq!(
            RpcCodec::decode::<Rec>(&b).unwrap_err(),
            CodecError::TooDeep(RpcCodec::MAX_DEPTH)
        );
    }

    #[test]
    fn matches_bincode_big_endian_fixint_for_plain_structs() {
        // A baseline cross-check: bincode 2 with big-endian fixed-width integers and u32
        // lengths agrees with RpcCodec on structs of ints, strings and vectors.
        let v = Inner {
            name: "abc".into(),
            values: vec![1, -1],
            flag: true,
        };
        let cfg = bincode::config::standard()
            .with_big_endian()
            .with_fixed_int_encoding();
        let theirs = bincode::serde::encode_to_vec(&v, cfg).unwrap();
        let ours = RpcCodec::encode(&v).unwrap();
        // bincode writes u64 lengths; ours are u32: compare after the length prefixes.
        assert_eq!(ours.len() + 8, theirs.len());
        assert_eq!(&ours[4..7], &theirs[8..11]);
    }
}
