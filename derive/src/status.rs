//! `#[derive(Status)]`: a status enum, how it is stored, and which states may move to
//! which, checked at compile time where a name could be wrong.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Expr, Fields, Ident, LitStr};

/// How the column holds a state.
enum Storage {
    /// `Text`: a name per variant (snake case, or `rename`).
    Text,
    /// `Integer`: each variant's discriminant.
    Integer,
}

/// One variant: its name, stored value and declared sources.
struct Variant {
    ident: Ident,
    stored: String,
    discriminant: Option<Expr>,
    sources: Vec<Ident>,
    /// `from(any)`: every other state may move to this one.
    from_any: bool,
}

/// Expands the derive, or the errors that stop it (each at its token, with a help line).
pub fn derive(input: &DeriveInput) -> syn::Result<TokenStream> {
    let Data::Enum(data) = &input.data else {
        return Err(syn::Error::new(
            input.ident.span(),
            "`#[derive(Status)]` goes on an enum of states\n  help: `enum OrderStatus { Valid, Shipped, .. }`",
        ));
    };
    if !input.generics.params.is_empty() {
        return Err(syn::Error::new(
            input.generics.span(),
            "a status enum cannot be generic",
        ));
    }
    let storage = storage(input)?;
    let mut errors: Vec<syn::Error> = Vec::new();
    let push = |errors: &mut Vec<syn::Error>, e| errors.push(e);
    let mut variants = Vec::new();
    for variant in &data.variants {
        if !matches!(variant.fields, Fields::Unit) {
            push(
                &mut errors,
                syn::Error::new(
                    variant.fields.span(),
                    "a state carries no data\n  help: keep the data in other columns",
                ),
            );
            continue;
        }
        match parse_variant(variant, &storage) {
            Ok(v) => variants.push(v),
            Err(e) => push(&mut errors, e),
        }
    }
    if variants.is_empty() && errors.is_empty() {
        push(
            &mut errors,
            syn::Error::new(input.ident.span(), "a status enum needs at least one state"),
        );
    }
    for (i, v) in variants.iter().enumerate() {
        if let Some(first) = variants[..i].iter().find(|w| w.stored == v.stored) {
            push(
                &mut errors,
                syn::Error::new(
                    v.ident.span(),
                    format!(
                    "`{}` is stored as {:?}, like `{}`\n  help: give one of them another `rename`",
                    v.ident, v.stored, first.ident
                ),
                ),
            );
        }
        for source in &v.sources {
            if !variants.iter().any(|w| &w.ident == source)
                && !data.variants.iter().any(|w| &w.ident == source)
            {
                let names: Vec<String> =
                    data.variants.iter().map(|w| w.ident.to_string()).collect();
                push(
                    &mut errors,
                    syn::Error::new(
                        source.span(),
                        format!(
                            "`{source}` is not a state of `{}`\n  help: the states are {}",
                            input.ident,
                            names.join(", ")
                        ),
                    ),
                );
            }
        }
    }
    let mut errors = errors.into_iter();
    if let Some(mut all) = errors.next() {
        for e in errors {
            all.combine(e);
        }
        return Err(all);
    }
    Ok(expand(&input.ident, &storage, &variants))
}

/// `#[occ(storage = "text" | "integer")]` on the enum; text by default.
fn storage(input: &DeriveInput) -> syn::Result<Storage> {
    let mut storage = Storage::Text;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("occ")) {
        attr.parse_nested_meta(|meta| {
            if !meta.path.is_ident("storage") {
                return Err(meta.error(
                    "unknown occ attribute on a status enum; expected `storage = \"text\"` or `storage = \"integer\"`",
                ));
            }
            let value: LitStr = meta.value()?.parse()?;
            storage = match value.value().as_str() {
                "text" => Storage::Text,
                "integer" => Storage::Integer,
                other => {
                    return Err(syn::Error::new(
                        value.span(),
                        format!("unknown storage {other:?}\n  help: `\"text\"` (a name per state) or `\"integer\"` (each variant's discriminant)"),
                    ))
                }
            };
            Ok(())
        })?;
    }
    Ok(storage)
}

/// A variant's `#[occ(from(..), rename = "..")]` and stored value.
fn parse_variant(variant: &syn::Variant, storage: &Storage) -> syn::Result<Variant> {
    let mut sources = Vec::new();
    let mut any: Option<Ident> = None;
    let mut rename: Option<LitStr> = None;
    for attr in variant.attrs.iter().filter(|a| a.path().is_ident("occ")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("from") {
                meta.parse_nested_meta(|source| {
                    match source.path.get_ident() {
                        Some(ident) if ident == "any" => any = Some(ident.clone()),
                        Some(ident) => sources.push(ident.clone()),
                        None => return Err(source.error("expected the name of a state")),
                    }
                    Ok(())
                })
            } else if meta.path.is_ident("rename") {
                rename = Some(meta.value()?.parse()?);
                Ok(())
            } else {
                Err(meta.error(
                    "unknown occ attribute on a state; expected `from(State, ..)`, `from(any)` or `rename = \"..\"`",
                ))
            }
        })?;
    }
    if let (Some(_), Some(named)) = (&any, sources.first()) {
        return Err(syn::Error::new(
            named.span(),
            format!(
                "`from(any)` already allows every other state: `{named}` beside it says nothing more\n  \
                 help: keep `from(any)`, or list the states: `from({named}, ..)`"
            ),
        ));
    }
    let discriminant = variant.discriminant.as_ref().map(|(_, e)| e.clone());
    let stored = match storage {
        Storage::Text => rename
            .map(|r| r.value())
            .unwrap_or_else(|| snake_case(&variant.ident.to_string())),
        Storage::Integer => {
            if let Some(rename) = rename {
                return Err(syn::Error::new(
                    rename.span(),
                    "`rename` names a stored text, but this enum is stored as integers\n  help: set the number with a discriminant: `Shipped = 2`",
                ));
            }
            match &discriminant {
                Some(Expr::Lit(lit)) => quote!(#lit).to_string(),
                Some(other) => {
                    return Err(syn::Error::new(
                        other.span(),
                        "a stored number must be a literal\n  help: `Shipped = 2`",
                    ))
                }
                None => {
                    return Err(syn::Error::new(
                        variant.ident.span(),
                        "a state stored as an integer needs its number\n  help: give it a discriminant: `Shipped = 2`",
                    ))
                }
            }
        }
    };
    Ok(Variant {
        ident: variant.ident.clone(),
        stored,
        discriminant,
        sources,
        from_any: any.is_some(),
    })
}

/// `ShippedLate` as `shipped_late`.
fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn expand(ident: &Ident, storage: &Storage, variants: &[Variant]) -> TokenStream {
    let d = quote!(::diesel_occ::diesel);
    let all: Vec<_> = variants.iter().map(|v| &v.ident).collect();
    let sources = variants.iter().map(|v| {
        let name = &v.ident;
        let from: Vec<TokenStream> = if v.from_any {
            variants
                .iter()
                .filter(|w| w.ident != v.ident)
                .map(|w| {
                    let other = &w.ident;
                    quote!(#ident::#other)
                })
                .collect()
        } else {
            v.sources
                .iter()
                .map(|s| quote_spanned!(s.span()=> #ident::#s))
                .collect()
        };
        quote!(#ident::#name => &[#(#from),*])
    });
    let names = variants.iter().map(|v| {
        let (name, stored) = (&v.ident, &v.stored);
        quote!(#ident::#name => #stored)
    });
    let expected = variants
        .iter()
        .map(|v| v.stored.clone())
        .collect::<Vec<_>>()
        .join(", ");
    let enum_name = ident.to_string();
    let (sql_type, mapping) = match storage {
        Storage::Text => {
            let to_text = variants.iter().map(|v| {
                let (name, stored) = (&v.ident, &v.stored);
                quote!(#ident::#name => #stored)
            });
            let from_text = variants.iter().map(|v| {
                let (name, stored) = (&v.ident, &v.stored);
                quote!(#stored => ::std::result::Result::Ok(#ident::#name))
            });
            (
                quote!(#d::sql_types::Text),
                quote! {
                    impl<__DB> #d::serialize::ToSql<#d::sql_types::Text, __DB> for #ident
                    where
                        __DB: #d::backend::Backend,
                        str: #d::serialize::ToSql<#d::sql_types::Text, __DB>,
                    {
                        fn to_sql<'__b>(&'__b self, out: &mut #d::serialize::Output<'__b, '_, __DB>) -> #d::serialize::Result {
                            let text: &'static str = match self { #(#to_text,)* };
                            <str as #d::serialize::ToSql<#d::sql_types::Text, __DB>>::to_sql(text, out)
                        }
                    }

                    impl<__DB> #d::deserialize::FromSql<#d::sql_types::Text, __DB> for #ident
                    where
                        __DB: #d::backend::Backend,
                        ::std::string::String: #d::deserialize::FromSql<#d::sql_types::Text, __DB>,
                    {
                        fn from_sql(value: <__DB as #d::backend::Backend>::RawValue<'_>) -> #d::deserialize::Result<Self> {
                            let raw = <::std::string::String as #d::deserialize::FromSql<#d::sql_types::Text, __DB>>::from_sql(value)?;
                            match raw.as_str() {
                                #(#from_text,)*
                                other => ::std::result::Result::Err(::std::format!(
                                    "the stored state {:?} is not a `{}` (expected one of: {})",
                                    other, #enum_name, #expected
                                ).into()),
                            }
                        }
                    }
                },
            )
        }
        Storage::Integer => {
            let to_number = variants.iter().map(|v| {
                let (name, number) = (&v.ident, v.discriminant.as_ref());
                quote!(#ident::#name => &(#number))
            });
            let from_number = variants.iter().map(|v| {
                let (name, number) = (&v.ident, v.discriminant.as_ref());
                quote!(n if n == (#number) => ::std::result::Result::Ok(#ident::#name))
            });
            (
                quote!(#d::sql_types::Integer),
                quote! {
                    impl<__DB> #d::serialize::ToSql<#d::sql_types::Integer, __DB> for #ident
                    where
                        __DB: #d::backend::Backend,
                        i32: #d::serialize::ToSql<#d::sql_types::Integer, __DB>,
                    {
                        fn to_sql<'__b>(&'__b self, out: &mut #d::serialize::Output<'__b, '_, __DB>) -> #d::serialize::Result {
                            let number: &'static i32 = match self { #(#to_number,)* };
                            <i32 as #d::serialize::ToSql<#d::sql_types::Integer, __DB>>::to_sql(number, out)
                        }
                    }

                    impl<__DB> #d::deserialize::FromSql<#d::sql_types::Integer, __DB> for #ident
                    where
                        __DB: #d::backend::Backend,
                        i32: #d::deserialize::FromSql<#d::sql_types::Integer, __DB>,
                    {
                        fn from_sql(value: <__DB as #d::backend::Backend>::RawValue<'_>) -> #d::deserialize::Result<Self> {
                            match <i32 as #d::deserialize::FromSql<#d::sql_types::Integer, __DB>>::from_sql(value)? {
                                #(#from_number,)*
                                other => ::std::result::Result::Err(::std::format!(
                                    "the stored state {} is not a `{}` (expected one of: {})",
                                    other, #enum_name, #expected
                                ).into()),
                            }
                        }
                    }
                },
            )
        }
    };
    let bound = quote!(#d::internal::derives::as_expression::Bound);
    quote! {
        const _: () = {
            impl ::diesel_occ::Status for #ident {
                const ALL: &'static [Self] = &[#(#ident::#all),*];

                fn sources(to: Self) -> &'static [Self] {
                    match to { #(#sources,)* }
                }

                fn name(self) -> &'static str {
                    match self { #(#names,)* }
                }
            }

            #mapping

            impl<__DB> #d::serialize::ToSql<#d::sql_types::Nullable<#sql_type>, __DB> for #ident
            where
                __DB: #d::backend::Backend,
                Self: #d::serialize::ToSql<#sql_type, __DB>,
            {
                fn to_sql<'__b>(&'__b self, out: &mut #d::serialize::Output<'__b, '_, __DB>) -> #d::serialize::Result {
                    #d::serialize::ToSql::<#sql_type, __DB>::to_sql(self, out)
                }
            }

            impl #d::expression::AsExpression<#sql_type> for #ident {
                type Expression = #bound<#sql_type, Self>;
                fn as_expression(self) -> Self::Expression {
                    #bound::new(self)
                }
            }

            impl<'__expr> #d::expression::AsExpression<#sql_type> for &'__expr #ident {
                type Expression = #bound<#sql_type, Self>;
                fn as_expression(self) -> Self::Expression {
                    #bound::new(self)
                }
            }

            impl #d::expression::AsExpression<#d::sql_types::Nullable<#sql_type>> for #ident {
                type Expression = #bound<#d::sql_types::Nullable<#sql_type>, Self>;
                fn as_expression(self) -> Self::Expression {
                    #bound::new(self)
                }
            }

            impl<'__expr> #d::expression::AsExpression<#d::sql_types::Nullable<#sql_type>> for &'__expr #ident {
                type Expression = #bound<#d::sql_types::Nullable<#sql_type>, Self>;
                fn as_expression(self) -> Self::Expression {
                    #bound::new(self)
                }
            }

            impl<__DB, __ST> #d::deserialize::Queryable<__ST, __DB> for #ident
            where
                __DB: #d::backend::Backend,
                __ST: #d::sql_types::SingleValue,
                Self: #d::deserialize::FromSql<__ST, __DB>,
            {
                type Row = Self;
                fn build(row: Self) -> #d::deserialize::Result<Self> {
                    ::std::result::Result::Ok(row)
                }
            }
        };
    }
}
