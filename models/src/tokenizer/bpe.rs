//! Byte-level BPE over ids: the model stage of the Qwen2 tokenizer, run by the `tokenizers`
//! pipeline (added tokens, split regex, byte-level respelling) in place of its own `BPE`.
//!
//! `tokenizers`' `BPE` takes the vocabulary as a map of owned strings and the merges as pairs
//! of owned strings, then builds a reverse map and looks every merge's three tokens up again:
//! for a vocabulary of 150k tokens that is most of the time and memory of building the
//! tokenizer. Here the token texts lie in one buffer, a table of ids hashed by text answers
//! lookups, and each merge is looked up once, straight into a map of id pairs. Words arrive
//! byte-level spelled, so their first symbols come from a table of the 256 byte tokens.
//!
//! The merge loop is the one of `tokenizers`: the lowest rank first, then the leftmost; a
//! queued merge is dropped once its pair no longer merges into the same id. Ids are the same.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::hash::BuildHasher;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use hashbrown::hash_table::Entry;
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use serde::{Serialize, Serializer};
use tokenizers::{AddedToken, Model, Token, Trainer};

use super::TokenizerError;
use super::byte_level::{SPELLING, byte_of};

/// A byte-level BPE vocabulary and its merges.
pub(crate) struct ByteLevelBpe {
    /// Every token's text, back to back.
    text: String,
    /// Id `i`'s text is `text[offsets[i]..offsets[i + 1]]`.
    offsets: Vec<u32>,
    /// Every id, found by its text.
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// The id of the one-character token that spells each byte.
    byte_ids: [u32; 256],
    /// `(left, right)` to `(rank, merged)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
}

/// A token whose text an earlier id already has.
pub(crate) struct Duplicate {
    pub(crate) first: u32,
}

impl ByteLevelBpe {
    /// An empty vocabulary with room for `tokens` tokens of `text_len` bytes in all, which
    /// the caller has checked to fit `u32` offsets.
    pub(crate) fn with_capacity(tokens: usize, text_len: usize) -> Self {
        let mut offsets = Vec::with_capacity(tokens + 1);
        offsets.push(0);
        Self {
            text: String::with_capacity(text_len),
            offsets,
            index: HashTable::with_capacity(tokens),
            hasher: DefaultHashBuilder::default(),
            byte_ids: [0; 256],
            merges: HashMap::default(),
        }
    }

    /// Adds `token` as the next id.
    pub(crate) fn push_token(&mut self, token: &str) -> Result<(), Duplicate> {
        let Self {
            text,
            offsets,
            index,
            hasher,
            ..
        } = self;
        let id = (offsets.len() - 1) as u32;
        match index.entry(
            hasher.hash_one(token),
            |&other| token_bytes(text, offsets, other) == token.as_bytes(),
            |&other| hasher.hash_one(token_text(text, offsets, other)),
        ) {
            Entry::Occupied(first) => {
                return Err(Duplicate {
                    first: *first.get(),
                });
            }
            Entry::Vacant(slot) => {
                slot.insert(id);
            }
        }
        text.push_str(token);
        // The caller checked that all texts together fit `u32` offsets.
        offsets.push(text.len() as u32);
        Ok(())
    }

    /// Finds the token of every byte once all tokens are in; the first byte without one is
    /// the error.
    pub(crate) fn find_byte_tokens(&mut self) -> Result<(), u8> {
        for (byte, &spelling) in (0u8..=255).zip(&SPELLING) {
            self.byte_ids[byte as usize] =
                self.id(spelling.encode_utf8(&mut [0; 4])).ok_or(byte)?;
        }
        Ok(())
    }

    /// Parses `"left right"` lines, best first, into the merge map. Each line's three tokens
    /// are looked up once, the joined one without building a string, and an error names the
    /// merge. A pair listed twice keeps its last rank, as in `tokenizers`.
    pub(crate) fn set_merges(&mut self, merges: Vec<String>) -> Result<(), TokenizerError> {
        if u32::try_from(merges.len()).is_err() {
            return Err(TokenizerError::TooManyMerges {
                count: merges.len(),
            });
        }
        let mut map = HashMap::with_capacity(merges.len());
        let mut joined = String::new();
        let mut guess = None;
        for (rank, merge) in (0u32..).zip(merges) {
            let index = rank as usize;
            let Some((left, right)) = merge
                .split_once(' ')
                .filter(|(l, r)| !l.is_empty() && !r.is_empty() && !r.contains(' '))
            else {
                return Err(TokenizerError::MalformedMerge { index, merge });
            };
            let find = |part: &str| self.id(part).ok_or_else(|| part.to_owned());
            let ids = find(left)
                .and_then(|l| Ok((l, find(right)?)))
                .and_then(|(l, r)| {
                    // Vocabularies list merged tokens in merge order, so the token after the
                    // last merge's is tried before hashing the joined text.
                    match guess {
                        Some(id) if self.is_joined(id, left, right) => Ok((l, r, id)),
                        _ => {
                            joined.clear();
                            joined.push_str(left);
                            joined.push_str(right);
                            Ok((l, r, find(&joined)?))
                        }
                    }
                });
            match ids {
                Ok((left, right, merged)) => {
                    map.insert((left, right), (rank, merged));
                    guess = merged.checked_add(1);
                }
                Err(missing) => {
                    return Err(TokenizerError::MergeOutOfVocabulary {
                        index,
                        merge,
                        missing,
                    });
                }
            }
        }
        self.merges = map;
        Ok(())
    }

    /// The id of the token spelled `token`.
    pub(crate) fn id(&self, token: &str) -> Option<u32> {
        self.index
            .find(self.hasher.hash_one(token), |&id| {
                token_bytes(&self.text, &self.offsets, id) == token.as_bytes()
            })
            .copied()
    }

    /// The text of `id`, which must be in the vocabulary.
    fn text(&self, id: u32) -> &str {
        token_text(&self.text, &self.offsets, id)
    }

    /// Whether `id` is a token spelled `left` then `right`.
    fn is_joined(&self, id: u32, left: &str, right: &str) -> bool {
        let id = id as usize;
        let Some(&[start, end]) = self.offsets.get(id..id + 2) else {
            return false;
        };
        let text = &self.text.as_bytes()[start as usize..end as usize];
        text.len() == left.len() + right.len()
            && text.starts_with(left.as_bytes())
            && text.ends_with(right.as_bytes())
    }

    fn vocab_size(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Merges `symbols` as `tokenizers`' `Word::merge_all` does.
    fn merge_all(&self, symbols: &mut [Symbol]) {
        let mut queue: BinaryHeap<Reverse<Queued>> = symbols
            .windows(2)
            .enumerate()
            .filter_map(|(pos, pair)| {
                let &(rank, merged) = self.merges.get(&(pair[0].id, pair[1].id))?;
                Some(Reverse(Queued { rank, pos, merged }))
            })
            .collect();
        while let Some(Reverse(top)) = queue.pop() {
            let left = symbols[top.pos];
            if left.len == 0 || left.next == NONE {
                continue;
            }
            let right = symbols[left.next];
            // A stale entry: a neighbour has merged since, and the pair here no longer merges
            // into the queued id (`tokenizers` compares the id only, and so does this).
            if self
                .merges
                .get(&(left.id, right.id))
                .is_none_or(|&(_, merged)| merged != top.merged)
            {
                continue;
            }
            let merged = Symbol {
                id: top.merged,
                len: left.len + right.len,
                prev: left.prev,
                next: right.next,
            };
            symbols[top.pos] = merged;
            symbols[left.next].len = 0;
            if merged.next != NONE {
                symbols[merged.next].prev = top.pos;
            }
            if merged.prev != NONE
                && let Some(&(rank, id)) = self.merges.get(&(symbols[merged.prev].id, merged.id))
            {
                queue.push(Reverse(Queued {
                    rank,
                    pos: merged.prev,
                    merged: id,
                }));
            }
            if merged.next != NONE
                && let Some(&(rank, id)) = self.merges.get(&(merged.id, symbols[merged.next].id))
            {
                queue.push(Reverse(Queued {
                    rank,
                    pos: top.pos,
                    merged: id,
                }));
            }
        }
    }
}

fn token_text<'t>(text: &'t str, offsets: &[u32], id: u32) -> &'t str {
    let id = id as usize;
    &text[offsets[id] as usize..offsets[id + 1] as usize]
}

/// [`token_text`] as bytes, for comparisons: slicing bytes skips the check of character
/// boundaries.
fn token_bytes<'t>(text: &'t str, offsets: &[u32], id: u32) -> &'t [u8] {
    let id = id as usize;
    &text.as_bytes()[offsets[id] as usize..offsets[id + 1] as usize]
}

/// No neighbour.
const NONE: usize = usize::MAX;

/// One symbol of a word being merged; a symbol merged into its left neighbour keeps its slot
/// with `len` 0.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    /// Bytes of spelled text it covers.
    len: usize,
    prev: usize,
    next: usize,
}

/// A merge waiting in the queue, ordered by rank, then position (the derive's field order).
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Queued {
    rank: u32,
    pos: usize,
    merged: u32,
}

impl Model for ByteLevelBpe {
    type Trainer = FixedVocabulary;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        let mut symbols = Vec::with_capacity(sequence.len());
        for c in sequence.chars() {
            let id = match byte_of(c) {
                Some(byte) => Some(self.byte_ids[byte as usize]),
                None => self.id(c.encode_utf8(&mut [0; 4])),
            };
            // Like `tokenizers` without an unknown token, a character outside the vocabulary
            // is left out (byte-level spelled text has none).
            if let Some(id) = id {
                let i = symbols.len();
                symbols.push(Symbol {
                    id,
                    len: c.len_utf8(),
                    prev: i.checked_sub(1).unwrap_or(NONE),
                    next: i + 1,
                });
            }
        }
        if let Some(last) = symbols.last_mut() {
            last.next = NONE;
        }
        self.merge_all(&mut symbols);
        let mut start = 0;
        Ok(symbols
            .iter()
            .filter(|s| s.len > 0)
            .map(|s| {
                let end = start + s.len;
                let token = Token::new(s.id, self.text(s.id).to_owned(), (start, end));
                start = end;
                token
            })
            .collect())
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        ((id as usize) < self.vocab_size()).then(|| self.text(id).to_owned())
    }

    fn get_vocab(&self) -> std::collections::HashMap<String, u32> {
        (0..self.vocab_size() as u32)
            .map(|id| (self.text(id).to_owned(), id))
            .collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.vocab_size()
    }

    /// Writes `vocab.json` and `merges.txt` as `tokenizers`' `BPE` does, so that it can load
    /// them.
    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        let path = |name: &str| match prefix {
            Some(prefix) => folder.join(format!("{prefix}-{name}")),
            None => folder.join(name),
        };
        let vocab_path = path("vocab.json");
        let mut vocab = BufWriter::new(File::create(&vocab_path)?);
        serde_json::to_writer(&mut vocab, &VocabInIdOrder(self))?;
        vocab.flush()?;

        let merges_path = path("merges.txt");
        let mut ranked: Vec<_> = self
            .merges
            .iter()
            .map(|(&pair, &(rank, _))| (rank, pair))
            .collect();
        ranked.sort_unstable();
        let mut merges = BufWriter::new(File::create(&merges_path)?);
        merges.write_all(b"#version: 0.2\n")?;
        for (_, (left, right)) in ranked {
            writeln!(merges, "{} {}", self.text(left), self.text(right))?;
        }
        merges.flush()?;
        Ok(vec![vocab_path, merges_path])
    }

    fn get_trainer(&self) -> FixedVocabulary {
        FixedVocabulary
    }
}

/// `{"token": id, ...}` in id order.
struct VocabInIdOrder<'a>(&'a ByteLevelBpe);

impl Serialize for VocabInIdOrder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map((0..self.0.vocab_size() as u32).map(|id| (self.0.text(id), id)))
    }
}

/// The trainer of [`ByteLevelBpe`], which refuses: its vocabulary and merges come whole from
/// the GGUF.
pub(crate) struct FixedVocabulary;

#[derive(Debug, thiserror::Error)]
#[error("the Qwen2 vocabulary comes whole from the GGUF and cannot be trained")]
struct NotTrainable;

impl Trainer for FixedVocabulary {
    type Model = ByteLevelBpe;

    fn should_show_progress(&self) -> bool {
        false
    }

    fn train(&self, _model: &mut ByteLevelBpe) -> tokenizers::Result<Vec<AddedToken>> {
        Err(Box::new(NotTrainable))
    }

    fn feed<I, S, F>(&mut self, _iterator: I, _process: F) -> tokenizers::Result<()>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
        F: Fn(&str) -> tokenizers::Result<Vec<String>> + Sync,
    {
        Err(Box::new(NotTrainable))
    }
}

#[cfg(test)]
mod tests {
    // Internals: the model is private to the crate.
    use super::*;
    use tokenizers::models::bpe::{BPE, Vocab};

    /// Merges chosen to collide: two pairs that merge into the same token (`ab c`, `a bc`),
    /// overlapping runs of one letter, and a pair listed twice (its last rank counts).
    const MERGES: [&str; 18] = [
        "a b",
        "b c",
        "ab c",
        "a bc",
        "a a",
        "aa a",
        "a aa",
        "b b",
        "bb b",
        "c c",
        "Ġ a",
        "Ġa b",
        "aa aa",
        "c a",
        "bc a",
        "Ġ Ġ",
        "ĠĠ ĠĠ",
        "a b",
    ];

    /// The 256 byte tokens in byte order, each merged token once, then a token that is not
    /// byte-spelled (as an added token would be).
    fn tokens() -> Vec<String> {
        let mut tokens: Vec<String> = SPELLING.iter().map(char::to_string).collect();
        for merge in MERGES {
            let joined = merge.replace(' ', "");
            if !tokens.contains(&joined) {
                tokens.push(joined);
            }
        }
        tokens.push("中".into());
        tokens
    }

    fn ours() -> ByteLevelBpe {
        let tokens = tokens();
        let text_len = tokens.iter().map(String::len).sum();
        let mut model = ByteLevelBpe::with_capacity(tokens.len(), text_len);
        for token in &tokens {
            assert!(model.push_token(token).is_ok());
        }
        assert!(model.find_byte_tokens().is_ok());
        model
            .set_merges(MERGES.map(str::to_owned).to_vec())
            .unwrap();
        model
    }

    fn reference() -> BPE {
        let vocab: Vocab = (0u32..).zip(tokens()).map(|(id, t)| (t, id)).collect();
        let merges = MERGES
            .iter()
            .map(|m| {
                let (l, r) = m.split_once(' ').unwrap();
                (l.to_owned(), r.to_owned())
            })
            .collect();
        BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .unwrap()
    }

    /// Every string of up to 6 characters over `a b c Ġ`, then pseudo-random longer ones,
    /// some with a character that only the vocabulary's text lookup finds (`中`) or that no
    /// token has (`字`).
    fn words() -> Vec<String> {
        let alphabet = ['a', 'b', 'c', 'Ġ'];
        let mut words = vec![String::new()];
        let mut last = vec![String::new()];
        for _ in 0..6 {
            last = last
                .iter()
                .flat_map(|w| alphabet.iter().map(move |&c| format!("{w}{c}")))
                .collect();
            words.extend(last.iter().cloned());
        }
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..5000 {
            let len = (state % 40) as usize;
            let mut word = String::new();
            for _ in 0..len {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                word.push(match state % 50 {
                    0 => '中',
                    1 => '字',
                    n => alphabet[n as usize % alphabet.len()],
                });
            }
            words.push(word);
        }
        words
    }

    fn assert_tokenizes_like(ours: &impl Model, reference: &impl Model) {
        for word in words() {
            assert_eq!(
                ours.tokenize(&word).unwrap(),
                reference.tokenize(&word).unwrap(),
                "{word:?}"
            );
        }
    }

    #[test]
    fn tokenizes_like_the_tokenizers_bpe() {
        assert_tokenizes_like(&ours(), &reference());
    }

    #[test]
    fn looks_tokens_up_like_the_tokenizers_bpe() {
        let (ours, reference) = (ours(), reference());
        assert_eq!(ours.get_vocab(), reference.get_vocab());
        assert_eq!(ours.get_vocab_size(), reference.get_vocab_size());
        for id in 0..=ours.get_vocab_size() as u32 {
            assert_eq!(ours.id_to_token(id), reference.id_to_token(id));
        }
        for token in ["a", "abc", "ĠĠĠĠ", "中", "字", "", "a b"] {
            assert_eq!(ours.token_to_id(token), reference.token_to_id(token));
        }
    }

    #[test]
    fn saves_files_the_tokenizers_bpe_loads_alike() {
        let dir = tempfile::tempdir().unwrap();
        let files = ours().save(dir.path(), Some("tiny")).unwrap();
        assert_eq!(
            files,
            [
                dir.path().join("tiny-vocab.json"),
                dir.path().join("tiny-merges.txt")
            ]
        );
        let [vocab, merges] = [&files[0], &files[1]].map(|f| f.to_str().unwrap().to_owned());
        let loaded = BPE::from_file(&vocab, &merges).build().unwrap();
        assert_tokenizes_like(&ours(), &loaded);
    }

    #[test]
    fn refuses_to_train() {
        let mut model = ours();
        let err = model.get_trainer().train(&mut model).unwrap_err();
        assert!(err.to_string().contains("cannot be trained"), "{err}");
    }
}
