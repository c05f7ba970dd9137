//! The names serde's derive knows about a type: an enum's variant names, a struct's field names,
//! one struct variant's field names. A probe is a deserializer that reads no data: the derived
//! code hands it the names (`VARIANTS`, `FIELDS`) and the probe stops there, so the lists shown
//! to users (`placement.*` errors in Lua) are the serde definitions themselves, not a copy.

use std::fmt;

use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};

/// The probe's only error: the names it was handed, or `None` when the type did not ask for
/// what was probed.
#[derive(Debug)]
struct Stop(Option<&'static [&'static str]>);

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("probe")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<T: fmt::Display>(_: T) -> Stop {
        Stop(None)
    }
}

/// The variant names of enum `T` (aliases included, in declaration order).
pub(crate) fn variants<T: DeserializeOwned>() -> Option<&'static [&'static str]> {
    names(T::deserialize(Probe::Variants))
}

/// The field names of struct `T`, in declaration order.
pub(crate) fn fields<T: DeserializeOwned>() -> Option<&'static [&'static str]> {
    names(T::deserialize(Probe::Fields))
}

/// The field names of enum `T`'s variant `variant` (empty for a unit variant; `None` for a
/// variant `T` does not have).
pub(crate) fn variant_fields<T: DeserializeOwned>(
    variant: &str,
) -> Option<&'static [&'static str]> {
    names(T::deserialize(Probe::Variant(variant)))
}

fn names<T>(result: Result<T, Stop>) -> Option<&'static [&'static str]> {
    match result {
        Ok(_) => None,
        Err(Stop(found)) => found,
    }
}

#[derive(Clone, Copy)]
enum Probe<'a> {
    Variants,
    Fields,
    Variant(&'a str),
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = Stop;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop(None))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        match self {
            Probe::Fields => Err(Stop(Some(fields))),
            _ => Err(Stop(None)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        match self {
            Probe::Variants => Err(Stop(Some(variants))),
            Probe::Variant(_) => visitor.visit_enum(self),
            Probe::Fields => Err(Stop(None)),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map identifier
        ignored_any
    }
}

impl<'de, 'a> de::EnumAccess<'de> for Probe<'a> {
    type Error = Stop;
    type Variant = Self;

    fn variant_seed<S: de::DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Self), Stop> {
        let Probe::Variant(name) = self else {
            return Err(Stop(None));
        };
        let value = seed.deserialize(IntoDeserializer::<Stop>::into_deserializer(name))?;
        Ok((value, self))
    }
}

impl<'de> de::VariantAccess<'de> for Probe<'_> {
    type Error = Stop;

    fn unit_variant(self) -> Result<(), Stop> {
        Err(Stop(Some(&[])))
    }

    fn newtype_variant_seed<S: de::DeserializeSeed<'de>>(self, _: S) -> Result<S::Value, Stop> {
        Err(Stop(None))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _: usize, _: V) -> Result<V::Value, Stop> {
        Err(Stop(None))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        Err(Stop(Some(fields)))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[allow(dead_code)]
    #[derive(Deserialize)]
    enum Shape {
        Dot,
        #[serde(rename = "Circle", alias = "Round")]
        Disc {
            radius: f64,
            #[serde(default)]
            filled: bool,
        },
        Line(f64, f64),
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct Canvas {
        width: u32,
        #[serde(rename = "shape_list")]
        shapes: Vec<Shape>,
    }

    #[test]
    fn probes_read_the_names_of_the_serde_definition() {
        assert_eq!(
            variants::<Shape>(),
            Some(&["Dot", "Circle", "Round", "Line"][..])
        );
        assert_eq!(fields::<Canvas>(), Some(&["width", "shape_list"][..]));
        assert_eq!(
            variant_fields::<Shape>("Circle"),
            Some(&["radius", "filled"][..])
        );
        assert_eq!(variant_fields::<Shape>("Dot"), Some(&[][..]));
        // What a probe cannot answer: no such variant, a tuple variant, the wrong kind of type.
        assert_eq!(variant_fields::<Shape>("Square"), None);
        assert_eq!(variant_fields::<Shape>("Line"), None);
        assert_eq!(fields::<Shape>(), None);
        assert_eq!(variants::<Canvas>(), None);
        assert_eq!(variants::<u32>(), None);
    }
}
