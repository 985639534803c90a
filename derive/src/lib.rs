#![warn(missing_docs)]
//! Derive macros of [diesel-occ](https://docs.rs/diesel-occ). Use them through that crate:
//! the generated code names its items as `::diesel_occ::...`.

mod ast;
mod attr;
mod expand;
mod valid;

use proc_macro::TokenStream;

/// Implements `diesel_occ::Guarded`; see the diesel-occ crate docs for the attributes.
#[proc_macro_derive(Guarded, attributes(occ))]
pub fn derive_guarded(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    ast::Entity::from_input(&input)
        .and_then(|entity| valid::check(&entity).map(|guard| expand::guarded(&entity, &guard)))
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
