#![warn(missing_docs)]
//! Derive macros of [diesel-occ](https://docs.rs/diesel-occ). Use them through that crate:
//! the generated code names its items as `::diesel_occ::...`.

mod ast;
mod attr;
mod expand;
mod fallback;
mod status;
mod valid;

use proc_macro::TokenStream;

/// Implements `diesel_occ::Guarded`; see the diesel-occ crate docs for the attributes.
#[proc_macro_derive(Guarded, attributes(occ))]
pub fn derive_guarded(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    let (entity, attr_errors) = match ast::Entity::from_input(&input) {
        Ok(described) => described,
        Err(error) => return error.into_compile_error().into(),
    };
    // Guard checks run on attributes that parsed; otherwise they would repeat the error.
    let expanded = attr_errors
        .finish()
        .and_then(|()| valid::check(&entity))
        .map(|guard| expand::guarded(&entity, &guard));
    match expanded {
        Ok(tokens) => tokens.into(),
        Err(errors) => {
            let mut out = errors.into_compile_error();
            if entity.diesel_can_derive() {
                out.extend(fallback::stub(&input));
            }
            out.into()
        }
    }
}

/// Implements `diesel_occ::status::Status` and the diesel mapping of a status enum; see
/// the diesel-occ crate docs (module `status`) for the attributes.
#[proc_macro_derive(Status, attributes(occ))]
pub fn derive_status(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    status::derive(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
