//! Checks across fields, reported together with spans that point at the mistake.

use syn::spanned::Spanned;

use crate::ast::{Entity, Field};
use crate::attr::{Errors, OccAttr};

const VERSION_TYPES: [&str; 3] = ["i16", "i32", "i64"];

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

fn check_version_field(entity: &Entity<'_>, field: &Field<'_>, errors: &mut Errors) {
    let type_name = match field.ty {
        syn::Type::Path(p) if p.qself.is_none() => {
            p.path.segments.last().map(|s| s.ident.to_string())
        }
        _ => None,
    };
    if !type_name.is_some_and(|t| VERSION_TYPES.contains(&t.as_str())) {
        errors.push(syn::Error::new(
            field.ty.span(),
            "an `#[occ(version)]` field must be `i16`, `i32` or `i64`\n  \
             help: use the integer type of the column (SMALLINT, INTEGER or BIGINT)",
        ));
    }
    if field.serialize_as.is_some() {
        errors.push(syn::Error::new(
            field.ty.span(),
            "an `#[occ(version)]` field cannot use `serialize_as`: it is written as it is",
        ));
    }
    if entity.is_key(field) {
        errors.push(syn::Error::new(
            field.ty.span(),
            "the `#[occ(version)]` field cannot be part of the primary key",
        ));
    }
}
