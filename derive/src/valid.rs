//! Checks across fields, reported together with spans that point at the mistake.

use syn::spanned::Spanned;

use crate::ast::{Entity, Field};
use crate::attr::{Errors, GuardAttr};

/// What guards the entity's writes.
pub enum Guard<'e, 'a> {
    /// One field carries the token, of the kind its attribute says.
    Token {
        field: &'e Field<'a>,
        attr: &'e GuardAttr,
    },
    /// The old values of these fields are the token.
    PreImage { fields: Vec<&'e Field<'a>> },
}

/// Checks the entity and returns its guard.
pub fn check<'e, 'a>(entity: &'e Entity<'a>) -> syn::Result<Guard<'e, 'a>> {
    let mut errors = Errors::default();
    let mut token: Option<(&'e Field<'a>, &'e GuardAttr)> = None;
    let mut compared = Vec::new();
    for field in &entity.fields {
        check_exclude(entity, field, &mut errors);
        check_json(entity, field, &mut errors);
        check_status(entity, field, &mut errors);
        check_compare(entity, field, &mut errors);
        if Entity::compared(field).is_some() {
            compared.push(field);
        }
        for attr in Entity::guards(field) {
            if let Some((_, first)) = &token {
                errors.push(syn::Error::new(
                    attr.ident().span(),
                    format!(
                        "a second guard field (`{}` after `{}`): a row has one token, and \
                         guard kinds do not combine\n  help: keep one of them",
                        attr.ident(),
                        first.ident()
                    ),
                ));
                continue;
            }
            if let GuardAttr::Xmin(ident) = attr {
                if !cfg!(feature = "postgres") {
                    errors.push(syn::Error::new(
                        ident.span(),
                        "`#[occ(xmin)]` is PostgreSQL's system column and needs diesel-occ's \
                         `postgres` feature\n  help: use `#[occ(version)]` on other backends",
                    ));
                }
            }
            if let GuardAttr::LastModified(stamping) = attr {
                if !cfg!(feature = "chrono") {
                    errors.push(syn::Error::new(
                        stamping.ident.span(),
                        "`#[occ(last_modified)]` needs diesel-occ's `chrono` feature\n  \
                         help: diesel-occ = { version = \"0.1\", features = [\"chrono\"] }",
                    ));
                }
            }
            token = Some((field, attr));
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
    check_updated_at(entity, token.map(|(_, attr)| attr), &mut errors);
    let guard = choose_guard(entity, token, compared, &mut errors);
    errors.finish()?;
    Ok(guard.expect("an error was reported when there is no guard"))
}

/// One guard from what the attributes ask for: a pre-image (of all columns, or of the
/// compared ones) or one token field; kinds do not combine.
fn choose_guard<'e, 'a>(
    entity: &'e Entity<'a>,
    token: Option<(&'e Field<'a>, &'e GuardAttr)>,
    compared: Vec<&'e Field<'a>>,
    errors: &mut Errors,
) -> Option<Guard<'e, 'a>> {
    let conflicting = |errors: &mut Errors, span: proc_macro2::Span, what: &str| {
        errors.push(syn::Error::new(
            span,
            format!(
                "{what}: a pre-image guard and a token guard do not combine\n  \
                 help: keep one of them"
            ),
        ));
    };
    if let Some(pre_image) = &entity.pre_image {
        if let Some((_, attr)) = token {
            conflicting(
                errors,
                attr.ident().span(),
                "`#[occ(pre_image)]` on the struct",
            );
        }
        for field in &compared {
            let compare = Entity::compared(field).expect("collected as compared");
            errors.push(syn::Error::new(
                compare.span(),
                "`#[occ(compare)]` under `#[occ(pre_image)]`: the struct's pre-image already \
                 compares every field\n  help: remove `compare`, or `#[occ(pre_image)]` to \
                 compare named fields only",
            ));
        }
        let fields: Vec<_> = entity
            .fields
            .iter()
            .filter(|f| {
                !entity.is_key(f)
                    && Entity::excluded(f).is_none()
                    && Entity::updated_at(f).is_none()
            })
            .collect();
        if fields.is_empty() {
            errors.push(syn::Error::new(
                pre_image.span(),
                "`#[occ(pre_image)]` has no field to compare: every field is the key or \
                 excluded",
            ));
            return None;
        }
        return Some(Guard::PreImage { fields });
    }
    if !compared.is_empty() {
        if let Some((_, attr)) = token {
            conflicting(errors, attr.ident().span(), "`#[occ(compare)]` fields");
            return None;
        }
        return Some(Guard::PreImage { fields: compared });
    }
    if token.is_none() {
        errors.push(syn::Error::new(
            entity.ident.span(),
            "`#[derive(Guarded)]` needs a guard\n  \
             help: mark a field: `#[occ(version)] version: i64` or \
             `#[occ(last_modified)] updated_at: NaiveDateTime`, or compare old values: \
             `#[occ(pre_image)]` on the struct, `#[occ(compare)]` on fields",
        ));
    }
    token.map(|(field, attr)| Guard::Token { field, attr })
}

/// `#[occ(updated_at)]`: one field, not the key, not a guard, compared or excluded field,
/// and not next to a last-modified guard (which already is the time of the last write).
fn check_updated_at(entity: &Entity<'_>, token: Option<&GuardAttr>, errors: &mut Errors) {
    let stamped: Vec<_> = entity
        .fields
        .iter()
        .filter_map(|f| Entity::updated_at(f).map(|s| (f, s)))
        .collect();
    for (i, (field, stamping)) in stamped.iter().enumerate() {
        let span = stamping.ident.span();
        let mut refuse = |message: &str| errors.push(syn::Error::new(span, message));
        if i > 0 {
            refuse("a second `#[occ(updated_at)]` field\n  help: keep it on one field");
        }
        if !cfg!(feature = "chrono") {
            refuse(
                "`#[occ(updated_at)]` needs diesel-occ's `chrono` feature\n  \
                 help: diesel-occ = { version = \"0.1\", features = [\"chrono\"] }",
            );
        }
        if entity.is_key(field) {
            refuse("`#[occ(updated_at)]` on a primary key field\n  help: put it on the timestamp field");
        }
        if stamping.database_clock() {
            refuse(
                "`#[occ(updated_at)]` takes the application's clock: the saved copy records \
                 the value it wrote\n  help: remove `clock = database`",
            );
        }
        if Entity::guards(field).next().is_some()
            || Entity::excluded(field).is_some()
            || Entity::compared(field).is_some()
        {
            refuse(
                "`#[occ(updated_at)]` combines with no other `occ` attribute on its field\n  \
                 help: keep `updated_at` alone on the timestamp field",
            );
        }
        if let Some(GuardAttr::LastModified(_)) = token {
            refuse(
                "`#[occ(updated_at)]` next to a `last_modified` guard: that column already \
                 records every write\n  help: remove `updated_at`",
            );
        }
    }
}

/// `#[occ(compare)]` goes on an ordinary field, not the key nor an excluded one.
fn check_compare(entity: &Entity<'_>, field: &Field<'_>, errors: &mut Errors) {
    let Some(compare) = Entity::compared(field) else {
        return;
    };
    if entity.is_key(field) {
        errors.push(syn::Error::new(
            compare.span(),
            "`#[occ(compare)]` on a primary key field: the key already finds the row\n  \
             help: compare other fields",
        ));
    }
    if Entity::excluded(field).is_some() {
        errors.push(syn::Error::new(
            compare.span(),
            "a field cannot be both compared and excluded\n  help: keep one of them",
        ));
    }
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

/// `#[occ(json)]` goes on an ordinary, guarded field: not the key, not the guard's token,
/// not an excluded field (its writes would go unguarded).
fn check_json(entity: &Entity<'_>, field: &Field<'_>, errors: &mut Errors) {
    let Some(json) = Entity::json(field) else {
        return;
    };
    let clash = if entity.is_key(field) {
        Some("a primary key field: the key is never written")
    } else if Entity::guards(field).next().is_some() {
        Some("the guard's own field: the token cannot be a document")
    } else if Entity::excluded(field).is_some() {
        Some("an excluded field: its merges would skip the guard")
    } else if Entity::updated_at(field).is_some() {
        Some("the `updated_at` field")
    } else {
        None
    };
    if let Some(clash) = clash {
        errors.push(syn::Error::new(
            json.span(),
            format!(
                "`#[occ(json)]` on {clash}\n  help: put it on the `serde_json::Value` field of \
                 the JSON column"
            ),
        ));
    }
}

/// `#[occ(status)]` goes on one ordinary field: not the key, the guard's token, an
/// excluded field (a transition must be guarded) or a JSON document.
fn check_status(entity: &Entity<'_>, field: &Field<'_>, errors: &mut Errors) {
    let Some(status) = Entity::status(field) else {
        return;
    };
    let clash = if entity.is_key(field) {
        Some("a primary key field: the key is never written")
    } else if Entity::guards(field).next().is_some() {
        Some("the guard's own field")
    } else if Entity::excluded(field).is_some() {
        Some("an excluded field: its transitions would skip the guard")
    } else if Entity::json(field).is_some() {
        Some("a JSON field")
    } else if entity
        .fields
        .iter()
        .filter(|f| Entity::status(f).is_some())
        .count()
        > 1
    {
        Some("more than one field: an entity has one status")
    } else {
        None
    };
    if let Some(clash) = clash {
        errors.push(syn::Error::new(
            status.span(),
            format!(
                "`#[occ(status)]` on {clash}\n  help: put it on the one field whose type \
                 derives `diesel_occ::Status`"
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
