//! Checks across fields, reported together with spans that point at the mistake.

use syn::spanned::Spanned;

use crate::ast::{Entity, Field};
use crate::attr::{Errors, OccAttr};

/// Checks the entity and returns its version field.
pub fn check<'e, 'a>(entity: &'e Entity<'a>) -> syn::Result<&'e Field<'a>> {
    let mut errors = Errors::default();
    let mut version = None;
    for field in &entity.fields {
        for OccAttr::Version(ident) in &field.occ {
            if version.is_some() {
                errors.push(syn::Error::new(
                    ident.span(),
                    "a second `#[occ(version)]` field: a row has exactly one version column\n  \
                     help: keep `#[occ(version)]` on one field only",
                ));
                continue;
            }
            version = Some(field);
            check_version_field(entity, field, &mut errors);
        }
        check_deserialize_as(entity, field, &mut errors);
        if let Some(span) = field.not_a_column {
            errors.push(syn::Error::new(
                span,
                "`#[derive(Guarded)]` needs every field to be one column of the table; \
                 `embed` and `select_expression` fields are not supported",
            ));
        }
    }
    for key in &entity.primary_key {
        if !entity.fields.iter().any(|f| &f.column == key) {
            errors.push(syn::Error::new(
                key.span(),
                format!(
                    "no field with column name `{key}` for the primary key\n  \
                     help: name the key columns with `#[diesel(primary_key(...))]`"
                ),
            ));
        }
    }
    if version.is_none() {
        errors.push(syn::Error::new(
            entity.ident.span(),
            "`#[derive(Guarded)]` needs a version field\n  \
             help: mark it: `#[occ(version)] version: i64` (i16, i32 or i64)",
        ));
    }
    errors.finish()?;
    Ok(version.expect("checked above"))
}

/// The version field's type is checked by the compiler against `VersionNumber` and the
/// column's SQL type, so that aliases (`type Rev = i64`) work and mistakes are reported
/// with the real types; here only what the types cannot say.
fn check_version_field(entity: &Entity<'_>, field: &Field<'_>, errors: &mut Errors) {
    if field.serialize_as.is_some() || field.deserialize_as.is_some() {
        errors.push(syn::Error::new(
            field.ty.span(),
            "an `#[occ(version)]` field cannot use `serialize_as` or `deserialize_as`: \
             the version is read and written as it is\n  \
             help: make the field the column's integer type (i16, i32, i64)",
        ));
    }
    if entity.is_key(field) {
        errors.push(syn::Error::new(
            field.ty.span(),
            "the `#[occ(version)]` field cannot be part of the primary key",
        ));
    }
}

/// A field read through `deserialize_as` has a type that may not be a column value, so
/// writing it (as a key or an updatable field) needs `serialize_as`, as with diesel's own
/// `AsChangeset`.
fn check_deserialize_as(entity: &Entity<'_>, field: &Field<'_>, errors: &mut Errors) {
    let written = entity.is_key(field) || !field.skip_update;
    let is_version = !field.occ.is_empty();
    if let (Some(span), None, true, false) = (
        field.deserialize_as,
        &field.serialize_as,
        written,
        is_version,
    ) {
        errors.push(syn::Error::new(
            span,
            "this field is read through `deserialize_as` and `#[derive(Guarded)]` also writes \
             it, but it has no `serialize_as`\n  \
             help: add `serialize_as = <column type>` (the field's own type if it already is \
             one), or `#[diesel(skip_update)]` if updates must not write it",
        ));
    }
}
