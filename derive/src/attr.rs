//! Parsing of the attributes the derive reads: its own `#[occ(...)]` and the parts of
//! diesel's `#[diesel(...)]` that say where the data lives.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::spanned::Spanned;
use syn::{Attribute, Ident, Path, Token, Type};

/// The field attributes of `#[occ(...)]`, for "expected one of" messages.
const OCC_FIELD_ATTRIBUTES: &str =
    "`version`, `last_modified`, `xmin`, `row_version`, `compare`, `exclude`, `updated_at`, `json`, `status`";

/// The precisions `last_modified(precision = "...")` accepts, with the library's type.
const PRECISIONS: [(&str, &str); 3] = [
    ("micros", "Micros"),
    ("millis", "Millis"),
    ("seconds", "Seconds"),
];

/// One `#[occ(...)]` item on a field. Keeps its ident so errors point at it.
pub enum OccAttr {
    /// The field is the guard's token.
    Guard(GuardAttr),
    /// `#[occ(exclude)]`: writes to this field neither check nor advance the token.
    Exclude(Ident),
    /// `#[occ(compare)]`: the field's old value is part of the pre-image guard.
    Compare(Ident),
    /// `#[occ(json)]`: a JSON document column, edited by read-merge-write or merged in SQL.
    Json(Ident),
    /// `#[occ(status)]`: the status column, moved by guarded transitions.
    Status(Ident),
    /// `#[occ(updated_at)]` or `#[occ(updated_at(precision = "..", clock = path))]`: set
    /// to now by every guarded write, not compared.
    UpdatedAt(Stamping),
}

/// The options of a timestamp the library sets: `precision` and `clock`.
pub struct Stamping {
    pub ident: Ident,
    /// The library's precision type (`Micros`, `Millis`, `Seconds`), if given.
    pub precision: Option<Ident>,
    /// A `diesel_occ::Clock` other than the system clock.
    pub clock: Option<Path>,
}

impl Stamping {
    /// `clock = database`: the server's clock rather than a `Clock` type.
    pub fn database_clock(&self) -> bool {
        self.clock
            .as_ref()
            .is_some_and(|path| path.is_ident("database"))
    }
}

/// The guard kinds a field can carry.
pub enum GuardAttr {
    /// `#[occ(version)]`: the version column.
    Version(Ident),
    /// `#[occ(xmin)]`: PostgreSQL's `xmin` system column.
    Xmin(Ident),
    /// `#[occ(row_version)]`: a column the database sets on every write (a trigger,
    /// `ON UPDATE`), compared and read back, never assigned.
    RowVersion(Ident),
    /// `#[occ(last_modified)]` or `#[occ(last_modified(precision = "..", clock = path))]`.
    LastModified(Stamping),
}

impl GuardAttr {
    /// The attribute's own word, where errors about it point.
    pub fn ident(&self) -> &Ident {
        match self {
            GuardAttr::Version(ident) | GuardAttr::Xmin(ident) | GuardAttr::RowVersion(ident) => {
                ident
            }
            GuardAttr::LastModified(stamping) => &stamping.ident,
        }
    }
}

/// Errors collected over the whole input, reported together.
#[derive(Default)]
pub struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

fn malformed(span: Span, message: &str) -> syn::Error {
    syn::Error::new(
        span,
        format!("{message}\n  help: the correct format looks like `#[occ(version)]`"),
    )
}

/// Parses the `#[occ(...)]` attributes of a field.
pub fn occ_field_attrs(attrs: &[Attribute], errors: &mut Errors) -> Vec<OccAttr> {
    let mut found = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("occ")) {
        if !matches!(attr.meta, syn::Meta::List(_)) {
            errors.push(syn::Error::new_spanned(
                attr,
                "`occ` takes a list of items\n  help: the correct format looks like `#[occ(version)]`",
            ));
            continue;
        }
        let parsed = attr.parse_nested_meta(|meta| {
            let Some(ident) = meta.path.get_ident().cloned() else {
                return Err(malformed(meta.path.span(), "expected a single word"));
            };
            if ident == "version" || ident == "xmin" || ident == "row_version" {
                if !meta.input.is_empty() && !meta.input.peek(Token![,]) {
                    return Err(malformed(
                        meta.input.span(),
                        &format!("`{ident}` takes no value"),
                    ));
                }
                found.push(OccAttr::Guard(if ident == "version" {
                    GuardAttr::Version(ident)
                } else if ident == "xmin" {
                    GuardAttr::Xmin(ident)
                } else {
                    GuardAttr::RowVersion(ident)
                }));
                Ok(())
            } else if ["exclude", "compare", "json", "status"]
                .iter()
                .any(|n| ident == n)
            {
                if !meta.input.is_empty() && !meta.input.peek(Token![,]) {
                    return Err(malformed(
                        meta.input.span(),
                        &format!("`{ident}` takes no value"),
                    ));
                }
                found.push(if ident == "exclude" {
                    OccAttr::Exclude(ident)
                } else if ident == "json" {
                    OccAttr::Json(ident)
                } else if ident == "status" {
                    OccAttr::Status(ident)
                } else {
                    OccAttr::Compare(ident)
                });
                Ok(())
            } else if ident == "last_modified" {
                found.push(OccAttr::Guard(GuardAttr::LastModified(stamping(
                    ident, &meta,
                )?)));
                Ok(())
            } else if ident == "updated_at" {
                found.push(OccAttr::UpdatedAt(stamping(ident, &meta)?));
                Ok(())
            } else {
                Err(syn::Error::new(
                    ident.span(),
                    format!(
                        "unknown occ attribute `{ident}`; expected one of: {OCC_FIELD_ATTRIBUTES}"
                    ),
                ))
            }
        });
        if let Err(e) = parsed {
            errors.push(e);
        }
    }
    found
}

/// `last_modified` or `updated_at`, bare or with `(precision = "micros" | "millis" |
/// "seconds", clock = path)`.
fn stamping(ident: Ident, meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Stamping> {
    let (mut precision, mut clock) = (None, None);
    if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|option| {
            if option.path.is_ident("precision") {
                let value: syn::LitStr = option.value()?.parse()?;
                let Some((_, ty)) = PRECISIONS.iter().find(|(name, _)| value.value() == *name)
                else {
                    return Err(syn::Error::new(
                        value.span(),
                        "unknown precision; expected one of: \"micros\" (the default), \
                         \"millis\", \"seconds\"\n  help: use the precision the column keeps: \
                         \"seconds\" for MySQL `DATETIME` without fractional digits",
                    ));
                };
                precision = Some(Ident::new(ty, value.span()));
                Ok(())
            } else if option.path.is_ident("clock") {
                clock = Some(option.value()?.parse()?);
                Ok(())
            } else {
                Err(syn::Error::new(
                    option.path.span(),
                    format!(
                        "unknown `{ident}` option; expected one of: `precision`, `clock`\n  \
                         help: the correct format looks like \
                         `#[occ({ident}(precision = \"seconds\", clock = my::Clock))]`"
                    ),
                ))
            }
        })?;
    } else if !meta.input.is_empty() && !meta.input.peek(Token![,]) {
        return Err(malformed(
            meta.input.span(),
            &format!("`{ident}` takes its options in parentheses"),
        ));
    }
    Ok(Stamping {
        ident,
        precision,
        clock,
    })
}

/// Reads the struct's own `#[occ(...)]`: `pre_image` is the one container attribute;
/// everything else goes on a field.
pub fn occ_container_attrs(attrs: &[Attribute], errors: &mut Errors) -> Option<Ident> {
    let mut pre_image = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("occ")) {
        let parsed = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("pre_image") && meta.input.is_empty() {
                pre_image = meta.path.get_ident().cloned();
                Ok(())
            } else {
                Err(syn::Error::new(
                    meta.path.span(),
                    "the struct takes only `#[occ(pre_image)]`; the other `occ` attributes \
                     go on a field\n  help: mark the guard field: `#[occ(version)] version: i64`",
                ))
            }
        });
        if let Err(e) = parsed {
            errors.push(e);
        }
    }
    pre_image
}

/// What the derive reads of diesel's container attributes.
#[derive(Default)]
pub struct DieselContainer {
    pub table_name: Option<Path>,
    pub primary_key: Option<Vec<Ident>>,
}

/// What the derive reads of diesel's field attributes.
#[derive(Default)]
pub struct DieselField {
    pub column_name: Option<Ident>,
    pub serialize_as: Option<Type>,
    pub deserialize_as: Option<Span>,
    pub skip_update: bool,
    /// `embed` or `select_expression`: fields that are not one column.
    pub not_a_column: Option<Span>,
}

/// Reads `table_name` and `primary_key`; other diesel keys belong to diesel and are skipped.
pub fn diesel_container(attrs: &[Attribute]) -> syn::Result<DieselContainer> {
    let mut out = DieselContainer::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("diesel")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("table_name") {
                out.table_name = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("primary_key") {
                let content;
                syn::parenthesized!(content in meta.input);
                let keys = content.parse_terminated(Ident::parse_any, Token![,])?;
                out.primary_key = Some(keys.into_iter().collect());
            } else {
                skip_value(meta.input)?;
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// Reads `column_name`, `serialize_as`, `deserialize_as`, `skip_update`, `embed`,
/// `select_expression`; other diesel keys belong to diesel and are skipped.
pub fn diesel_field(attrs: &[Attribute]) -> syn::Result<DieselField> {
    let mut out = DieselField::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("diesel")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("column_name") {
                out.column_name = Some(column_name(meta.value()?)?);
            } else if meta.path.is_ident("serialize_as") {
                out.serialize_as = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("deserialize_as") {
                out.deserialize_as = Some(meta.path.span());
                skip_value(meta.input)?;
            } else if meta.path.is_ident("skip_update") {
                out.skip_update = true;
            } else {
                if meta.path.is_ident("embed") || meta.path.is_ident("select_expression") {
                    out.not_a_column = Some(meta.path.span());
                }
                skip_value(meta.input)?;
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// `column_name = note` or, as diesel also accepts, `column_name = "note"` (which can name
/// a column that is a Rust keyword or not an identifier at all).
fn column_name(input: ParseStream<'_>) -> syn::Result<Ident> {
    if !input.peek(syn::LitStr) {
        return input.call(Ident::parse_any);
    }
    let literal: syn::LitStr = input.parse()?;
    let mut ident =
        syn::parse::Parser::parse_str(Ident::parse_any, &literal.value()).map_err(|_| {
            syn::Error::new(
                literal.span(),
                format!(
                    "`{}` is not a column of a `table!` schema\n  \
                 help: use the column's name as your `table!` definition spells it",
                    literal.value()
                ),
            )
        })?;
    ident.set_span(literal.span());
    Ok(ident)
}

/// Skips what follows a diesel key we do not read: `= <type, expression or literal>`, or
/// a parenthesised list such as `check_for_backend(diesel::pg::Pg, diesel::sqlite::Sqlite)`
/// or `belongs_to(User, foreign_key = author)`, consumed whole.
fn skip_value(input: ParseStream<'_>) -> syn::Result<()> {
    if input.peek(Token![=]) {
        input.parse::<Token![=]>()?;
        // Types (`dsl::Foo<a, b>`) contain commas outside any group, so try them first.
        let fork = input.fork();
        if fork.parse::<Type>().is_ok() && (fork.is_empty() || fork.peek(Token![,])) {
            input.parse::<Type>()?;
        } else {
            input.parse::<syn::Expr>()?;
        }
    } else if input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in input);
        content.parse::<proc_macro2::TokenStream>()?;
    }
    Ok(())
}
