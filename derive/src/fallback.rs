//! What the derive emits next to its error: an implementation that type-checks and does
//! nothing, so that the user sees the one real error, not one more at every call of a
//! `GuardedWrite` method.

use proc_macro2::TokenStream;
use quote::quote;
use syn::DeriveInput;

/// A do-nothing `impl Guarded` for a plain struct; nothing for other inputs, whose error
/// already says the derive does not apply to them.
pub fn stub(input: &DeriveInput) -> TokenStream {
    if !matches!(input.data, syn::Data::Struct(_)) || !input.generics.params.is_empty() {
        return TokenStream::new();
    }
    let ident = &input.ident;
    quote! {
        const _: () = {
            impl ::diesel_occ::Guarded for #ident {
                type Key = ();
                type KeyPredicate = ::diesel_occ::diesel::expression::SqlLiteral<
                    ::diesel_occ::diesel::sql_types::Bool,
                >;
                type Guard = ::diesel_occ::__private::Unusable;
                type Changes = ::diesel_occ::__private::NoChanges<
                    <Self as ::diesel_occ::diesel::associations::HasTable>::Table,
                >;
                const GUARD_COLUMNS: &'static [&'static str] = &[];

                fn key(&self) {}

                fn key_predicate(_: &()) -> Self::KeyPredicate {
                    ::diesel_occ::diesel::dsl::sql("FALSE")
                }

                type KeysPredicate = ::diesel_occ::diesel::expression::SqlLiteral<
                    ::diesel_occ::diesel::sql_types::Bool,
                >;

                fn keys_predicate(_: &[()]) -> Self::KeysPredicate {
                    ::diesel_occ::diesel::dsl::sql("FALSE")
                }

                fn token(&self) {}

                fn set_token(&mut self, _: ()) {}

                fn changes(&self) -> Self::Changes {
                    ::std::default::Default::default()
                }

                type StatusKept = ::diesel_occ::__private::Unguarded;

                fn status_kept(&self) -> Self::StatusKept {
                    ::diesel_occ::__private::Unguarded
                }

                type Stamp = ::diesel_occ::__private::Unguarded;

                fn stamp() -> Self::Stamp {
                    ::diesel_occ::__private::Unguarded
                }

                fn set_stamp(&mut self, _: &Self::Stamp) {}
            }
        };
    }
}
