//! The medians in BENCHMARKS.md as the benchmark printed them: each block between
//! `<!-- medians <backend> <workload> -->` and `<!-- /medians -->` is replaced with the
//! medians of the latest runs of that workload on that backend, so that no figure in
//! those blocks is copied by hand. A block not in the document yet is added at its end.

/// The closing marker of every block.
const END: &str = "<!-- /medians -->";

/// The opening marker of the block `key` (`"<backend> <workload>"`).
fn start(key: &str) -> String {
    format!("<!-- medians {key} -->")
}

/// `doc` with the block of each `(key, table)` replaced by `table` (or added at the end).
pub fn write_into(doc: &str, blocks: &[(String, String)]) -> Result<String, String> {
    let mut doc = doc.to_string();
    for (key, table) in blocks {
        let block = format!("{}\n{}\n{END}", start(key), table.trim());
        match doc.find(&start(key)) {
            Some(at) => {
                let end = doc[at..]
                    .find(END)
                    .ok_or_else(|| format!("the block `{key}` has no `{END}`"))?;
                doc.replace_range(at..at + end + END.len(), &block);
            }
            None => {
                if !doc.ends_with('\n') {
                    doc.push('\n');
                }
                doc.push('\n');
                doc.push_str(&block);
                doc.push('\n');
            }
        }
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_replaced_in_place_or_added_at_the_end() {
        let doc = "# B\n\ntext\n<!-- medians sqlite W6 -->\nold\ntable\n<!-- /medians -->\nafter\n";
        let blocks = vec![
            ("sqlite W6".to_string(), "\n### new\n| a |\n".to_string()),
            ("postgres W6".to_string(), "### pg\n".to_string()),
        ];
        let written = write_into(doc, &blocks).unwrap();
        assert_eq!(
            written,
            "# B\n\ntext\n<!-- medians sqlite W6 -->\n### new\n| a |\n<!-- /medians -->\nafter\n\n\
             <!-- medians postgres W6 -->\n### pg\n<!-- /medians -->\n"
        );
        // Written again with the same figures, nothing moves.
        assert_eq!(write_into(&written, &blocks).unwrap(), written);
    }

    #[test]
    fn an_unclosed_block_is_an_error() {
        let doc = "<!-- medians sqlite W6 -->\nold\n";
        let blocks = vec![("sqlite W6".to_string(), "new".to_string())];
        assert!(write_into(doc, &blocks).unwrap_err().contains("has no"));
    }
}
