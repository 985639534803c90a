use proc_macro::TokenStream; #[proc_macro_derive(Guarded, attributes(occ))] pub fn d(_i: TokenStream)->TokenStream{TokenStream::new()}
