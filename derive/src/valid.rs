//! Checks across fields, reported together with spans that point at the mistake.

use syn::spanned::Spanned;

use crate::ast::{Entity, Field};
use crate::attr::{Errors, GuardAttr};

/// The field that carries the token, and the attribute that says which kind.
pub struct Guard<'e, 'a> {
    pub field: &'e Field<'a>,
    pub attr: &'e GuardAttr,
}

/// Checks the entity and returns its guard.
pub fn check<'e, 'a>(entity: &'e Entity<'a>) -> syn::Result<Guard<'e, 'a>> {
    let mut errors = Errors::default();
    let mut guard: Option<Guard<'e, 'a>> = None;
    for field in &entity.fields {
        check_exclude(entity, field, &mut errors);
        for attr in Entity::guards(field) {
            if let Some(first) = &guard {
                errors.push(syn::Error::new(
                    attr.ident().span(),
                    format!(
                        "a second guard field (`{}` after `{}`): a row has one token, and \
                         guard kinds do not combine\n  help: keep one of them",
                        attr.ident(),
                        first.attr.ident()
                    ),
                ));
                continue;
            }
            if let GuardAttr::LastModified { ident, .. } = attr {
                if !cfg!(feature = "chrono") {
                    errors.push(syn::Error::new(
                        ident.span(),
                        "`#[occ(last_modified)]` needs diesel-occ's `chrono` feature\n  \
                         help: diesel-occ = { version = \"0.1\", features = [\"chrono\"] }",
                    ));
                }
            }
            guard = Some(Guard { field, attr });
            check_guard_field(entity, field, attr, &mut errors);
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
    if guard.is_none() {
        errors.push(syn::Error::new(
            entity.ident.span(),
            "`#[derive(Guarded)]` needs a guard field\n  \
             help: mark it: `#[occ(version)] version: i64` or \
             `#[occ(last_modified)] updated_at: NaiveDateTime`",
        ));
    }
    errors.finish()?;
    Ok(guard.expect("checked above"))
}

/// The guard field's type is checked by the compiler against the guard kind's bounds and
/// the column's SQL type, so that aliases (`type Rev = i64`) work and mistakes are
/// reported with the real types; here only what the types cannot say.
fn check_guard_field(
    entity: &Entity<'_>,
    field: &Field<'_>,
    attr: &GuardAttr,
    errors: &mut Errors,
) {
    let kind = attr.ident();
    if field.serialize_as.is_some() || field.deserialize_as.is_some() {
        errors.push(syn::Error::new(
            field.ty.span(),
            format!(
                "an `#[occ({kind})]` field cannot use `serialize_as` or `deserialize_as`: \
                 the token is read and written as it is\n  \
                 help: make the field the column's own type"
            ),
        ));
    }
    if entity.is_key(field) {
        errors.push(syn::Error::new(
            field.ty.span(),
            format!("the `#[occ({kind})]` field cannot be part of the primary key"),
        ));
    }
}

/// `#[occ(exclude)]` goes on an ordinary field: not the key (the row is found by it) and
/// not the guard field (its writes are what the guard is).
fn check_exclude(entity: &Entity<'_>, field: &Field<'_>, errors: &mut Errors) {
    let Some(exclude) = Entity::excluded(field) else {
        return;
    };
    if entity.is_key(field) {
        errors.push(syn::Error::new(
            exclude.span(),
            "`#[occ(exclude)]` on a primary key field: the key is how a write finds its row, \
             it is never written\n  help: remove `exclude` from this field",
        ));
    }
    if let Some(guard) = Entity::guards(field).next() {
        errors.push(syn::Error::new(
            exclude.span(),
            format!(
                "`#[occ(exclude)]` on the `{}` field: the guard's own column cannot be \
                 excluded from the guard\n  help: exclude other fields, such as view counters",
                guard.ident()
            ),
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
