//! The entity as the derive sees it: table, key columns and fields with their columns.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{DeriveInput, Ident, Member, Path, Type};

use crate::attr::{self, Errors, GuardAttr, OccAttr, Stamping};

pub struct Entity<'a> {
    pub ident: &'a Ident,
    pub table: Path,
    /// Key column names, from `#[diesel(primary_key(...))]` or `id`.
    pub primary_key: Vec<Ident>,
    /// `#[occ(pre_image)]` on the struct: every column but the key and excluded ones is
    /// compared.
    pub pre_image: Option<Ident>,
    pub fields: Vec<Field<'a>>,
    /// diesel's attributes on every field parsed.
    diesel_ok: bool,
}

pub struct Field<'a> {
    pub member: Member,
    pub ty: &'a Type,
    pub column: Ident,
    pub occ: Vec<OccAttr>,
    pub serialize_as: Option<Type>,
    /// The span of `deserialize_as`, which changes the field's type as read.
    pub deserialize_as: Option<Span>,
    pub skip_update: bool,
    pub not_a_column: Option<Span>,
}

impl<'a> Entity<'a> {
    /// The entity, with the errors of its own attributes (reported, but the entity is
    /// still described, so that the derive can emit a stand-in next to them). An `Err`
    /// means the input cannot be described at all.
    pub fn from_input(input: &'a DeriveInput) -> syn::Result<(Self, Errors)> {
        let syn::Data::Struct(data) = &input.data else {
            return Err(syn::Error::new(
                input.ident.span(),
                "`#[derive(Guarded)]` works on structs that map a table row",
            ));
        };
        if !input.generics.params.is_empty() {
            return Err(syn::Error::new(
                input.generics.span(),
                "`#[derive(Guarded)]` does not support generic structs: a row type owns its values",
            ));
        }
        let mut errors = Errors::default();
        let pre_image = attr::occ_container_attrs(&input.attrs, &mut errors);
        let diesel = attr::diesel_container(&input.attrs)?;
        let table = diesel
            .table_name
            .unwrap_or_else(|| default_table_name(&input.ident).into());
        let primary_key = diesel
            .primary_key
            .unwrap_or_else(|| vec![Ident::new("id", input.ident.span())]);

        let mut fields = Vec::new();
        let mut diesel_ok = true;
        for (index, field) in data.fields.iter().enumerate() {
            let occ = attr::occ_field_attrs(&field.attrs, &mut errors);
            let diesel = match attr::diesel_field(&field.attrs) {
                Ok(d) => d,
                Err(e) => {
                    errors.push(e);
                    diesel_ok = false;
                    continue;
                }
            };
            let member = match &field.ident {
                Some(ident) => Member::Named(ident.clone()),
                None => Member::Unnamed(index.into()),
            };
            let column = match (diesel.column_name, &field.ident) {
                (Some(column), _) => column,
                (None, Some(ident)) => ident.clone(),
                (None, None) => {
                    errors.push(syn::Error::new(
                        field.span(),
                        "a tuple struct field needs `#[diesel(column_name = ...)]`",
                    ));
                    diesel_ok = false;
                    continue;
                }
            };
            fields.push(Field {
                member,
                ty: &field.ty,
                column,
                occ,
                serialize_as: diesel.serialize_as,
                deserialize_as: diesel.deserialize_as,
                skip_update: diesel.skip_update,
                not_a_column: diesel.not_a_column,
            });
        }
        let entity = Entity {
            ident: &input.ident,
            table,
            primary_key,
            pre_image,
            fields,
            diesel_ok,
        };
        Ok((entity, errors))
    }

    /// Whether diesel's own derives can work on this struct: its attributes parsed and
    /// its key columns are fields. Only then is a stand-in implementation emitted next to
    /// an error (it needs diesel's `HasTable`); otherwise it would add errors of its own.
    pub fn diesel_can_derive(&self) -> bool {
        self.diesel_ok
            && self
                .primary_key
                .iter()
                .all(|key| self.fields.iter().any(|f| &f.column == key))
    }

    /// The field's `#[occ(exclude)]`, if it has one.
    pub fn excluded<'f>(field: &'f Field<'_>) -> Option<&'f Ident> {
        field.occ.iter().find_map(|attr| match attr {
            OccAttr::Exclude(ident) => Some(ident),
            _ => None,
        })
    }

    /// The field's `#[occ(json)]`, if it has one.
    pub fn json<'f>(field: &'f Field<'_>) -> Option<&'f Ident> {
        field.occ.iter().find_map(|attr| match attr {
            OccAttr::Json(ident) => Some(ident),
            _ => None,
        })
    }

    /// The field's `#[occ(status)]`, if it has one.
    pub fn status<'f>(field: &'f Field<'_>) -> Option<&'f Ident> {
        field.occ.iter().find_map(|attr| match attr {
            OccAttr::Status(ident) => Some(ident),
            _ => None,
        })
    }

    /// The field's `#[occ(updated_at)]`, if it has one.
    pub fn updated_at<'f>(field: &'f Field<'_>) -> Option<&'f Stamping> {
        field.occ.iter().find_map(|attr| match attr {
            OccAttr::UpdatedAt(stamping) => Some(stamping),
            _ => None,
        })
    }

    /// The field's `#[occ(compare)]`, if it has one.
    pub fn compared<'f>(field: &'f Field<'_>) -> Option<&'f Ident> {
        field.occ.iter().find_map(|attr| match attr {
            OccAttr::Compare(ident) => Some(ident),
            _ => None,
        })
    }

    /// The field's guard attributes (one, unless the input is wrong).
    pub fn guards<'f>(field: &'f Field<'_>) -> impl Iterator<Item = &'f GuardAttr> {
        field.occ.iter().filter_map(|attr| match attr {
            OccAttr::Guard(guard) => Some(guard),
            _ => None,
        })
    }

    pub fn is_key(&self, field: &Field<'_>) -> bool {
        self.primary_key.contains(&field.column)
    }
}

/// diesel's default: `OrderLine` -> `order_lines`.
fn default_table_name(ident: &Ident) -> Ident {
    let mut snake = String::new();
    for (i, c) in ident.to_string().chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                snake.push('_');
            }
            snake.extend(c.to_lowercase());
        } else {
            snake.push(c);
        }
    }
    snake.push('s');
    Ident::new(&snake, ident.span())
}
