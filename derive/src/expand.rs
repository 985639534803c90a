//! The generated `impl diesel_occ::Guarded`.
//!
//! Everything is named by absolute path and wrapped in `const _: () = { ... };`, so the
//! expansion neither needs nor adds anything in the user's scope except the table module,
//! which it resolves where the struct is defined, like diesel's own derives.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;

use crate::ast::{Entity, Field};
use crate::attr::{GuardAttr, Stamping};
use crate::valid::Guard;

pub fn guarded(entity: &Entity<'_>, guard: &Guard<'_, '_>) -> TokenStream {
    let token_column = match guard {
        Guard::Token { field, .. } => Some(&field.column),
        Guard::PreImage { .. } => None,
    };
    let ident = entity.ident;
    let table = &entity.table;
    let column = |f: &Field<'_>| {
        let c = &f.column;
        quote!(#table::#c)
    };
    // A field's value as written to its column: cloned, then converted if `serialize_as`.
    let value = |f: &Field<'_>, source: TokenStream| match &f.serialize_as {
        Some(ty) => (
            quote!(#ty),
            quote!(::std::convert::Into::<#ty>::into(::std::clone::Clone::clone(#source))),
        ),
        None => {
            let ty = f.ty;
            (quote!(#ty), quote!(::std::clone::Clone::clone(#source)))
        }
    };

    let keys: Vec<&Field<'_>> = entity
        .primary_key
        .iter()
        .map(|k| {
            entity
                .fields
                .iter()
                .find(|f| &f.column == k)
                .expect("validated")
        })
        .collect();
    let key_types: Vec<_> = keys.iter().map(|f| f.ty).collect();
    let key_members: Vec<_> = keys.iter().map(|f| &f.member).collect();
    let (key_type, key_value) = if keys.len() == 1 {
        let (ty, member) = (key_types[0], key_members[0]);
        (
            quote!(#ty),
            quote!(::std::clone::Clone::clone(&self.#member)),
        )
    } else {
        (
            quote!((#(#key_types,)*)),
            quote!((#(::std::clone::Clone::clone(&self.#key_members),)*)),
        )
    };
    // `a = key.0 AND b = key.1 ...`, folded left like `a.eq(..).and(b.eq(..))`.
    let mut predicate: Option<(TokenStream, TokenStream)> = None;
    for (i, f) in keys.iter().enumerate() {
        let col = column(f);
        let source = if keys.len() == 1 {
            quote!(key)
        } else {
            let index = syn::Index::from(i);
            quote!(&key.#index)
        };
        let (bound_ty, bound) = value(f, source);
        let eq_ty = quote!(::diesel_occ::diesel::dsl::Eq<#col, #bound_ty>);
        let eq = quote!(::diesel_occ::diesel::ExpressionMethods::eq(#col, #bound));
        predicate = Some(match predicate {
            None => (eq_ty, eq),
            Some((ty, expr)) => (
                quote!(::diesel_occ::diesel::dsl::And<#ty, #eq_ty>),
                quote!(::diesel_occ::diesel::BoolExpressionMethods::and(#expr, #eq)),
            ),
        });
    }
    let (predicate_type, predicate) = predicate.expect("validated: at least one key column");
    // The rows of many keys: `key IN (...)` padded to a power of two for one key column
    // (`= ANY(?)` on PostgreSQL), the keys' own predicates joined by `OR` for several.
    let (keys_predicate_type, keys_predicate) = if keys.len() == 1 {
        let col = column(keys[0]);
        let (bound_ty, bound) = value(keys[0], quote!(key));
        (
            quote!(::diesel_occ::__private::KeyIn<#col, #bound_ty>),
            quote!(::diesel_occ::__private::KeyIn::new(
                #col,
                ::std::iter::Iterator::collect::<::std::vec::Vec<_>>(
                    ::std::iter::Iterator::map(keys.iter(), |key| #bound)
                ),
            )),
        )
    } else {
        (
            quote!(::diesel_occ::__private::AnyOf<Self::KeyPredicate>),
            quote!(::diesel_occ::__private::AnyOf(
                ::std::iter::Iterator::collect(::std::iter::Iterator::map(
                    keys.iter(),
                    <Self as ::diesel_occ::Guarded>::key_predicate
                ))
            )),
        )
    };

    let changed: Vec<&Field<'_>> = entity
        .fields
        .iter()
        .filter(|f| {
            !entity.is_key(f)
                && !f.skip_update
                && Some(&f.column) != token_column
                && Entity::excluded(f).is_none()
                && Entity::updated_at(f).is_none()
                && Entity::status(f).is_none()
        })
        .collect();
    let excluded_columns: Vec<TokenStream> = entity
        .fields
        .iter()
        .filter(|f| Entity::excluded(f).is_some())
        .map(|f| {
            let col = column(f);
            quote!(<#col as ::diesel_occ::diesel::Column>::NAME)
        })
        .collect();
    let (changes_type, changes) = if changed.is_empty() {
        (
            quote!(::diesel_occ::__private::NoChanges<#table::table>),
            quote!(::std::default::Default::default()),
        )
    } else {
        let (types, values): (Vec<_>, Vec<_>) = changed
            .iter()
            .map(|f| {
                let col = column(f);
                let member = &f.member;
                let (ty, v) = value(f, quote!(&self.#member));
                (
                    quote!(::diesel_occ::diesel::dsl::Eq<#col, #ty>),
                    quote!(::diesel_occ::diesel::ExpressionMethods::eq(#col, #v)),
                )
            })
            .unzip();
        (quote!((#(#types,)*)), quote!((#(#values,)*)))
    };

    let guard_columns: Vec<TokenStream> = match guard {
        Guard::Token { field, .. } => vec![column(field)],
        Guard::PreImage { fields } => fields.iter().map(|f| column(f)).collect(),
    }
    .into_iter()
    .map(|col| quote!(<#col as ::diesel_occ::diesel::Column>::NAME))
    .collect();
    let (guard_kind_items, guard_items) = match guard {
        Guard::Token { field, attr } => (TokenStream::new(), token_guard(field, attr, &column)),
        Guard::PreImage { fields } => pre_image_guard(fields, &column, &value),
    };
    let stamp = stamp_items(entity, &column);
    let changed_columns = match guard {
        Guard::PreImage { fields } if entity.pre_image.is_some() => {
            changed_columns(ident, fields, &column, &value)
        }
        _ => TokenStream::new(),
    };

    let json_documents = json_documents(ident, entity, &column);
    let unwritable_document = unwritable_document(entity, &column);
    let status = status_column(ident, entity, &column);
    let status_kept = status_kept(entity, &column);

    quote! {
        const _: () = {
            #guard_kind_items
            #changed_columns
            #json_documents
            #status

            impl ::diesel_occ::Guarded for #ident {
                type Key = #key_type;
                type KeyPredicate = #predicate_type;
                #guard_items
                type Changes = #changes_type;
                const GUARD_COLUMNS: &'static [&'static str] = &[#(#guard_columns),*];
                const EXCLUDED_COLUMNS: &'static [&'static str] = &[#(#excluded_columns),*];

                fn key(&self) -> Self::Key {
                    #key_value
                }

                fn key_predicate(key: &Self::Key) -> Self::KeyPredicate {
                    #predicate
                }

                type KeysPredicate = #keys_predicate_type;

                fn keys_predicate(keys: &[Self::Key]) -> Self::KeysPredicate {
                    #keys_predicate
                }

                fn changes(&self) -> Self::Changes {
                    #changes
                }

                #status_kept

                #stamp

                #unwritable_document
            }
        };
    }
}

/// `JsonDocument<column>` for each `#[occ(json)]` field. The accessors are spanned at the
/// field's type, so a field that is not a `serde_json::Value` is reported there.
fn json_documents(
    ident: &syn::Ident,
    entity: &Entity<'_>,
    column: &dyn Fn(&Field<'_>) -> TokenStream,
) -> TokenStream {
    entity
        .fields
        .iter()
        .filter(|f| Entity::json(f).is_some())
        .map(|f| {
            let (col, member) = (column(f), &f.member);
            // The field goes through a function taking a `Value`, spanned at the field's
            // type, so that a field of another type is reported there.
            let (read, edit) = (
                quote_spanned!(f.ty.span()=> ::diesel_occ::__private::field(&self.#member)),
                quote_spanned!(f.ty.span()=> ::diesel_occ::__private::field_mut(&mut self.#member)),
            );
            quote! {
                impl ::diesel_occ::JsonDocument<#col> for #ident {
                    fn document(&self) -> &::diesel_occ::serde_json::Value {
                        #read
                    }
                    fn document_mut(&mut self) -> &mut ::diesel_occ::serde_json::Value {
                        #edit
                    }
                }
            }
        })
        .collect()
}

/// `Guarded::unwritable_document`, when the entity has `#[occ(json)]` fields: each is
/// read through its `JsonDocument` impl, so a field of the wrong type is reported once,
/// there.
fn unwritable_document(
    entity: &Entity<'_>,
    column: &dyn Fn(&Field<'_>) -> TokenStream,
) -> TokenStream {
    let checks: Vec<TokenStream> = entity
        .fields
        .iter()
        .filter(|f| Entity::json(f).is_some())
        .map(|f| {
            let col = column(f);
            quote! {
                if let ::std::option::Option::Some(reason) = ::diesel_occ::__private::document_refusal(
                    <Self as ::diesel_occ::JsonDocument<#col>>::document(self),
                ) {
                    return ::std::option::Option::Some((
                        <#col as ::diesel_occ::diesel::Column>::NAME,
                        reason,
                    ));
                }
            }
        })
        .collect();
    if checks.is_empty() {
        return TokenStream::new();
    }
    quote! {
        fn unwritable_document(&self) -> ::std::option::Option<(&'static str, ::std::string::String)> {
            #(#checks)*
            ::std::option::Option::None
        }
    }
}

/// `HasStatus` for the `#[occ(status)]` field; its type must implement
/// `diesel_occ::status::Status`, which the bound reports at the field's type.
fn status_column(
    ident: &syn::Ident,
    entity: &Entity<'_>,
    column: &dyn Fn(&Field<'_>) -> TokenStream,
) -> TokenStream {
    let Some(f) = entity.fields.iter().find(|f| Entity::status(f).is_some()) else {
        return TokenStream::new();
    };
    let (col, member) = (column(f), &f.member);
    let ty = respan(f.ty.to_token_stream(), f.ty.span());
    quote! {
        impl ::diesel_occ::HasStatus for #ident {
            type Status = #ty;
            type StatusColumn = #col;

            fn status(&self) -> #ty {
                self.#member
            }

            fn set_status(&mut self, status: #ty) {
                self.#member = status;
            }
        }
    }
}

/// `STATUS_COLUMN`, `type StatusKept`, `status_kept` and `status_name`: the condition
/// that the row is in the copy's state, for an entity with a status; nothing otherwise.
fn status_kept(entity: &Entity<'_>, column: &dyn Fn(&Field<'_>) -> TokenStream) -> TokenStream {
    let Some(f) = entity.fields.iter().find(|f| Entity::status(f).is_some()) else {
        return quote! {
            type StatusKept = ::diesel_occ::__private::Unguarded;

            fn status_kept(&self) -> Self::StatusKept {
                ::diesel_occ::__private::Unguarded
            }
        };
    };
    // Through `HasStatus`, and spanned at the field's type, so that a type that is no
    // status enum is reported there with the trait's hint.
    let col = column(f);
    let items = quote! {
        const STATUS_COLUMN: ::std::option::Option<&'static str> =
            ::std::option::Option::Some(<#col as ::diesel_occ::diesel::Column>::NAME);

        type StatusKept = ::diesel_occ::__private::ColumnEq<
            #col,
            <Self as ::diesel_occ::HasStatus>::Status,
        >;

        fn status_kept(&self) -> Self::StatusKept {
            ::diesel_occ::__private::ColumnEq::new(::diesel_occ::HasStatus::status(self))
        }

        fn status_name(&self) -> ::std::option::Option<&'static str> {
            ::std::option::Option::Some(::diesel_occ::Status::name(
                ::diesel_occ::HasStatus::status(self),
            ))
        }
    };
    respan(items, f.ty.span())
}

/// `type Guard`, `token` and `set_token` for a guard whose token is one field.
fn token_guard(
    field: &Field<'_>,
    attr: &GuardAttr,
    column: &dyn Fn(&Field<'_>) -> TokenStream,
) -> TokenStream {
    let ty = field.ty;
    let member = &field.member;
    // Spanned at the field, so that a token type or column the trait bounds refuse
    // (`String`, a `Nullable` column) is reported there, with the bound's own hint.
    let col = column(field);
    let guard_kind = match attr {
        GuardAttr::Version(_) => quote!(::diesel_occ::VersionGuard<#col, #ty>),
        GuardAttr::Xmin(_) => quote!(::diesel_occ::XminGuard<#col>),
        GuardAttr::RowVersion(_) => quote!(::diesel_occ::RowVersionGuard<#col, #ty>),
        GuardAttr::LastModified(stamping) if stamping.database_clock() => {
            let (_, precision) = clock_and_precision(stamping);
            quote!(::diesel_occ::DatabaseClockGuard<#col, #ty, #precision>)
        }
        GuardAttr::LastModified(stamping) => {
            let (clock, precision) = clock_and_precision(stamping);
            quote!(::diesel_occ::LastModifiedGuard<#col, #ty, #clock, #precision>)
        }
    };
    let guard_kind = respan(guard_kind, ty.span());
    let guard_type = quote_spanned! {ty.span()=>
        type Guard = #guard_kind;
    };
    quote! {
        #guard_type

        fn token(&self) -> #ty {
            ::std::clone::Clone::clone(&self.#member)
        }

        fn set_token(&mut self, token: #ty) {
            self.#member = token;
        }
    }
}

/// A guard kind of the entity's own whose token is the compared fields' values (as
/// written, after `serialize_as`), and `type Guard`, `token`, `set_token` for it.
/// `set_token` does nothing: after a write the copy's fields are the new pre-image.
fn pre_image_guard(
    fields: &[&Field<'_>],
    column: &dyn Fn(&Field<'_>) -> TokenStream,
    value: &dyn Fn(&Field<'_>, TokenStream) -> (TokenStream, TokenStream),
) -> (TokenStream, TokenStream) {
    let mut token_types = Vec::new();
    let mut token_values = Vec::new();
    let mut predicate: Option<(TokenStream, TokenStream)> = None;
    for (i, field) in fields.iter().enumerate() {
        let member = &field.member;
        let (ty, v) = value(field, quote!(&self.#member));
        let col = column(field);
        let index = syn::Index::from(i);
        // Spanned at the field: a column that cannot be compared exactly is refused here.
        let eq_ty = respan(
            quote!(::diesel_occ::__private::NullSafeEq<#col, #ty>),
            field.ty.span(),
        );
        let eq = respan(
            quote!(<#eq_ty>::new(::std::clone::Clone::clone(&token.#index))),
            field.ty.span(),
        );
        predicate = Some(match predicate {
            None => (eq_ty, eq),
            Some((all_ty, all)) => (
                quote!(::diesel_occ::__private::AllOf<#all_ty, #eq_ty>),
                quote!(::diesel_occ::__private::all_of(#all, #eq)),
            ),
        });
        token_types.push(ty);
        token_values.push(v);
    }
    let (predicate_type, predicate) = predicate.expect("validated: at least one field");
    let kind = quote! {
        /// The entity's pre-image guard.
        pub struct PreImage;

        impl ::diesel_occ::GuardKind for PreImage {
            type Token = (#(#token_types,)*);
            type Predicate = #predicate_type;
            type Advance = ::diesel_occ::__private::Unguarded;
            type Completion = ::diesel_occ::__private::Counted;

            fn predicate(token: &Self::Token) -> Self::Predicate {
                #predicate
            }

            fn advance(token: &Self::Token) -> ::std::option::Option<(Self::Advance, Self::Token)> {
                ::std::option::Option::Some((
                    ::diesel_occ::__private::Unguarded,
                    ::std::clone::Clone::clone(token),
                ))
            }

            fn describe(token: &Self::Token) -> ::diesel_occ::Token {
                ::diesel_occ::Token::PreImage(::std::format!("{:?}", token))
            }
        }

        /// An inserted row's pre-image is its values.
        impl ::diesel_occ::SeedsTokens for PreImage {
            fn seed(token: &Self::Token) -> Self::Token {
                ::std::clone::Clone::clone(token)
            }
        }
    };
    let items = quote! {
        type Guard = PreImage;

        fn token(&self) -> (#(#token_types,)*) {
            (#(#token_values,)*)
        }

        fn set_token(&mut self, _: (#(#token_types,)*)) {}
    };
    (kind, items)
}

/// The clock and precision types a timestamp the library sets is computed with.
fn clock_and_precision(stamping: &Stamping) -> (TokenStream, TokenStream) {
    let clock = stamping
        .clock
        .as_ref()
        .map_or_else(|| quote!(::diesel_occ::SystemClock), |path| quote!(#path));
    let precision = stamping
        .precision
        .as_ref()
        .map_or_else(|| quote!(Micros), |p| quote!(#p));
    (clock, quote!(::diesel_occ::#precision))
}

/// `type Stamp`, `stamp` and `set_stamp`: the `#[occ(updated_at)]` field set to now by
/// every guarded write, or nothing.
fn stamp_items(entity: &Entity<'_>, column: &dyn Fn(&Field<'_>) -> TokenStream) -> TokenStream {
    let stamped = entity
        .fields
        .iter()
        .find_map(|f| Entity::updated_at(f).map(|s| (f, s)));
    let Some((field, stamping)) = stamped else {
        return quote! {
            type Stamp = ::diesel_occ::__private::Unguarded;

            fn stamp() -> Self::Stamp {
                ::diesel_occ::__private::Unguarded
            }

            fn set_stamp(&mut self, _: &Self::Stamp) {}
        };
    };
    let (clock, precision) = clock_and_precision(stamping);
    let (col, ty, member) = (column(field), field.ty, &field.member);
    let stamp_type = respan(
        quote!(::diesel_occ::__private::ColumnEq<#col, #ty>),
        ty.span(),
    );
    let now = respan(
        quote!(::diesel_occ::__private::stamp_now::<#ty, #clock, #precision>()),
        ty.span(),
    );
    quote! {
        type Stamp = #stamp_type;

        fn stamp() -> Self::Stamp {
            ::diesel_occ::__private::ColumnEq::new(#now)
        }

        fn set_stamp(&mut self, stamp: &Self::Stamp) {
            self.#member = ::std::clone::Clone::clone(stamp.value());
        }
    }
}

/// `impl ChangedColumns` for a `#[occ(pre_image)]` entity: per updatable compared field,
/// its new value and its old value's comparison when the two copies differ.
fn changed_columns(
    ident: &syn::Ident,
    fields: &[&Field<'_>],
    column: &dyn Fn(&Field<'_>) -> TokenStream,
    value: &dyn Fn(&Field<'_>, TokenStream) -> (TokenStream, TokenStream),
) -> TokenStream {
    // The status is moved by transitions only; a changed one is refused before this runs.
    let fields: Vec<_> = fields
        .iter()
        .filter(|f| !f.skip_update && Entity::status(f).is_none())
        .collect();
    if fields.is_empty() {
        return TokenStream::new();
    }
    let mut change_types = Vec::new();
    let mut per_field = Vec::new();
    let mut changes = Vec::new();
    let mut old: Option<(TokenStream, TokenStream)> = None;
    for (i, field) in fields.iter().enumerate() {
        let member = &field.member;
        let col = column(field);
        let (ty, new_value) = value(field, quote!(&self.#member));
        let (_, old_value) = value(field, quote!(&original.#member));
        let var = quote::format_ident!("field_{}", i);
        let compare_old = respan(
            quote!(::diesel_occ::__private::NullSafeEq::<#col, #ty>::new(old)),
            field.ty.span(),
        );
        per_field.push(quote! {
            let #var = {
                let (new, old): (#ty, #ty) = (#new_value, #old_value);
                if new == old {
                    (::std::option::Option::None, ::std::option::Option::None)
                } else {
                    changed = true;
                    (
                        ::std::option::Option::Some(::diesel_occ::diesel::ExpressionMethods::eq(#col, new)),
                        ::std::option::Option::Some(#compare_old),
                    )
                }
            };
        });
        change_types.push(quote!(::std::option::Option<::diesel_occ::diesel::dsl::Eq<#col, #ty>>));
        changes.push(quote!(#var.0));
        let old_ty = respan(
            quote!(::std::option::Option<::diesel_occ::__private::NullSafeEq<#col, #ty>>),
            field.ty.span(),
        );
        old = Some(match old {
            None => (old_ty, quote!(#var.1)),
            Some((all_ty, all)) => (
                quote!(::diesel_occ::__private::AllOf<#all_ty, #old_ty>),
                quote!(::diesel_occ::__private::all_of(#all, #var.1)),
            ),
        });
    }
    let (old_type, old_values) = old.expect("at least one field");
    quote! {
        impl ::diesel_occ::ChangedColumns for #ident {
            type ChangedValues = (#(#change_types,)*);
            type OldValues = #old_type;

            fn changed_since(
                &self,
                original: &Self,
            ) -> ::std::option::Option<(Self::ChangedValues, Self::OldValues)> {
                let mut changed = false;
                #(#per_field)*
                if !changed {
                    return ::std::option::Option::None;
                }
                ::std::option::Option::Some(((#(#changes,)*), #old_values))
            }
        }
    }
}

/// `tokens` with every span set to `span`, so that errors about them point there.
fn respan(tokens: TokenStream, span: proc_macro2::Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let proc_macro2::TokenTree::Group(group) = &token {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                token = proc_macro2::TokenTree::Group(inner);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}
