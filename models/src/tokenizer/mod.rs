//! Qwen2 byte-level BPE tokenizer, built from the vocabulary a GGUF file embeds, and the
//! Qwen2.5 chat prompt.
//!
//! The constructor takes plain data (`tokenizer.ggml.tokens`, `.merges`, `.token_type`, the
//! special ids) so this module needs no GGUF parser. Encoding runs the `tokenizers` crate's
//! pipeline (added tokens, the split regex of Qwen2's pre-tokenizer, byte-level respelling)
//! with this module's BPE model, built over ids and one text buffer rather than the crate's
//! maps of owned strings (see `bpe`); decoding maps ids to bytes through a table built here,
//! so that [`Qwen2Tokenizer::decode`] and [`StreamDecoder`] share one definition of the bytes
//! behind an id.
//!
//! Text is not Unicode-normalized before encoding: this follows llama.cpp and the GGUF
//! conversion of Hugging Face transformers, which the tests use as the reference (the original
//! Hugging Face Qwen2 tokenizer applies NFC first, so a decomposed accent may encode
//! differently there).

mod bpe;
mod byte_level;
mod chat;
mod stream;

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    SplitDelimiterBehavior, TokenizerImpl,
};

use bpe::{ByteLevelBpe, Duplicate};

pub use chat::{DEFAULT_SYSTEM_PROMPT, chat_prompt};
pub use stream::StreamDecoder;

/// The split regex of Qwen2's pre-tokenizer (`tokenizer.ggml.pre = "qwen2"`): like GPT-4's
/// but with single digits (`\p{N}` rather than `\p{N}{1,3}`).
pub const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.token_type` values, as llama.cpp defines them.
pub mod token_type {
    /// Not set by the converter.
    pub const UNDEFINED: i32 = 0;
    /// An ordinary BPE token, spelled in the byte alphabet.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// A special token (`<|im_end|>`): matched whole in text, ends or frames turns.
    pub const CONTROL: i32 = 3;
    /// An added token that is not special (`<tool_call>`): also matched whole in text.
    pub const USER_DEFINED: i32 = 4;
    /// A placeholder row (`[PAD151665]`), never produced by encoding.
    pub const UNUSED: i32 = 5;
    /// A byte-fallback token (`<0x0A>`), used by sentencepiece vocabularies.
    pub const BYTE: i32 = 6;
}

/// Ids in the vocabulary are `u32`; GGUF arrays may in principle be longer.
const MAX_VOCAB: usize = u32::MAX as usize;

/// Why a vocabulary was refused, or an id could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("the vocabulary is empty")]
    EmptyVocabulary,
    #[error("the vocabulary has {count} tokens, more than u32 ids can number")]
    TooManyTokens { count: usize },
    #[error("the tokens spell {bytes} bytes in all, more than u32 offsets can address")]
    TooManyBytes { bytes: usize },
    #[error("there are {count} merges, more than u32 ranks can number")]
    TooManyMerges { count: usize },
    #[error("{tokens} tokens but {token_types} token types")]
    TokenTypeCount { tokens: usize, token_types: usize },
    #[error("token {id} ({token:?}) has unknown token type {token_type}")]
    UnknownTokenType {
        id: u32,
        token: String,
        token_type: i32,
    },
    #[error("token {token:?} appears twice, as id {first} and id {second}")]
    DuplicateToken {
        token: String,
        first: u32,
        second: u32,
    },
    #[error("normal token {id} ({token:?}) is not spelled in the byte-level alphabet")]
    NotByteLevel { id: u32, token: String },
    #[error("the vocabulary has no token for byte 0x{byte:02X} (spelled {spelling:?})")]
    MissingByteToken { byte: u8, spelling: char },
    #[error("merge {index} ({merge:?}) is not two tokens separated by one space")]
    MalformedMerge { index: usize, merge: String },
    #[error("merge {index} ({merge:?}) needs {missing:?}, which is not in the vocabulary")]
    MergeOutOfVocabulary {
        index: usize,
        merge: String,
        missing: String,
    },
    #[error("{what} id {id} is outside the vocabulary of {vocab_size} tokens")]
    IdOutOfRange {
        what: &'static str,
        id: u32,
        vocab_size: usize,
    },
    #[error("add_bos is set but there is no BOS token id")]
    AddBosWithoutBos,
    #[error("the tokenizers crate failed to {action}")]
    Backend {
        action: &'static str,
        #[source]
        source: tokenizers::Error,
    },
    #[error("the GGUF's tokenizer metadata: {0}")]
    Gguf(#[source] Box<burn_mapped::gguf::GgufError>),
}

/// The `tokenizers` pipeline around [`ByteLevelBpe`]: no normalizer, post-processor or
/// decoder is set.
type Pipeline = TokenizerImpl<
    ByteLevelBpe,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// Qwen2 byte-level BPE over a GGUF-embedded vocabulary.
pub struct Qwen2Tokenizer {
    inner: Pipeline,
    /// The bytes behind every id, back to back: one allocation rather than one per token.
    bytes: Vec<u8>,
    /// Id `i`'s bytes are `bytes[offsets[i]..offsets[i + 1]]`.
    offsets: Vec<u32>,
    eos: u32,
    bos: Option<u32>,
    add_bos: bool,
    /// Ids that end a chat reply, `eos` first.
    eos_ids: Vec<u32>,
    /// Ids of control tokens (`<|im_end|>`, `<|endoftext|>`, ...), sorted: markup a reader
    /// never sees.
    control: Vec<u32>,
}

impl std::fmt::Debug for Qwen2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen2Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos", &self.eos)
            .field("bos", &self.bos)
            .field("add_bos", &self.add_bos)
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

impl Qwen2Tokenizer {
    /// Builds the tokenizer from a GGUF's `tokenizer.ggml.*` arrays: `tokens[i]` is id `i`,
    /// `merges` are `"left right"` pairs best first, `token_types` as in [`token_type`].
    ///
    /// Control and user-defined tokens become added tokens, matched whole wherever they
    /// appear in the text to encode. Everything is checked up front: the arrays agree in
    /// length, tokens are unique, normal tokens are byte-level spelled, every byte has a
    /// token (so no input can fall outside the vocabulary), every merge names known tokens,
    /// and the special ids are in range.
    /// The tokenizer a GGUF file embeds (`tokenizer.ggml.*`). Takes the parsed header so the
    /// token and merge strings move into the tokenizer rather than being copied; they are all
    /// freed once it is built, and those pages handed back to the system (`malloc_trim` on
    /// glibc) rather than staying in the process's anonymous memory for the rest of the run.
    ///
    /// # Errors
    /// [`TokenizerError::Gguf`] for missing or mistyped metadata, and what
    /// [`from_vocab`](Self::from_vocab) refuses.
    pub fn from_gguf(mut gguf: burn_mapped::gguf::GgufFile) -> Result<Self, TokenizerError> {
        let gguf_err = |e| TokenizerError::Gguf(Box::new(e));
        let tokens = gguf
            .take_str_array("tokenizer.ggml.tokens")
            .map_err(gguf_err)?;
        let merges = gguf
            .take_str_array("tokenizer.ggml.merges")
            .map_err(gguf_err)?;
        let types = gguf
            .get_i32_array("tokenizer.ggml.token_type")
            .map_err(gguf_err)?
            .to_vec();
        let eos = gguf
            .get_u32("tokenizer.ggml.eos_token_id")
            .map_err(gguf_err)?;
        let bos = gguf.get_u32("tokenizer.ggml.bos_token_id").ok();
        let add_bos = gguf
            .get_bool("tokenizer.ggml.add_bos_token")
            .unwrap_or(false);
        drop(gguf);
        let tokenizer = Self::from_vocab(tokens, merges, types, eos, bos, add_bos);
        release_free_heap();
        tokenizer
    }

    pub fn from_vocab(
        tokens: Vec<String>,
        merges: Vec<String>,
        token_types: Vec<i32>,
        eos: u32,
        bos: Option<u32>,
        add_bos: bool,
    ) -> Result<Self, TokenizerError> {
        if tokens.is_empty() {
            return Err(TokenizerError::EmptyVocabulary);
        }
        if tokens.len() > MAX_VOCAB {
            return Err(TokenizerError::TooManyTokens {
                count: tokens.len(),
            });
        }
        if tokens.len() != token_types.len() {
            return Err(TokenizerError::TokenTypeCount {
                tokens: tokens.len(),
                token_types: token_types.len(),
            });
        }
        let vocab_size = tokens.len();
        let in_range = |what: &'static str, id: u32| {
            if (id as usize) < vocab_size {
                Ok(id)
            } else {
                Err(TokenizerError::IdOutOfRange {
                    what,
                    id,
                    vocab_size,
                })
            }
        };
        in_range("EOS", eos)?;
        if let Some(bos) = bos {
            in_range("BOS", bos)?;
        } else if add_bos {
            return Err(TokenizerError::AddBosWithoutBos);
        }

        // Decoded bytes are never longer than the spelling (a character is 1-2 UTF-8 bytes
        // per byte it spells), so the text length bounds both tables.
        let text_len: usize = tokens.iter().map(String::len).sum();
        if u32::try_from(text_len).is_err() {
            return Err(TokenizerError::TooManyBytes { bytes: text_len });
        }
        let mut model = ByteLevelBpe::with_capacity(vocab_size, text_len);
        let mut bytes = Vec::with_capacity(text_len);
        let mut offsets = Vec::with_capacity(vocab_size + 1);
        offsets.push(0u32);
        let mut added = Vec::new();
        let mut control = Vec::new();
        for (id, (token, &kind)) in (0u32..).zip(tokens.into_iter().zip(&token_types)) {
            if !(token_type::UNDEFINED..=token_type::BYTE).contains(&kind) {
                return Err(TokenizerError::UnknownTokenType {
                    id,
                    token,
                    token_type: kind,
                });
            }
            let spelled = byte_level::push_token_bytes(&token, &mut bytes);
            if kind == token_type::NORMAL && !spelled {
                return Err(TokenizerError::NotByteLevel { id, token });
            }
            // At most `text_len` bytes, checked above.
            offsets.push(bytes.len() as u32);
            if let Err(Duplicate { first }) = model.push_token(&token) {
                return Err(TokenizerError::DuplicateToken {
                    token,
                    first,
                    second: id,
                });
            }
            match kind {
                token_type::CONTROL => {
                    control.push(id);
                    added.push(AddedToken::from(token, true));
                }
                token_type::USER_DEFINED => added.push(AddedToken::from(token, false)),
                _ => {}
            }
        }
        if let Err(byte) = model.find_byte_tokens() {
            let spelling = byte_level::SPELLING[byte as usize];
            return Err(TokenizerError::MissingByteToken { byte, spelling });
        }
        model.set_merges(merges)?;

        let split = Split::new(
            SplitPattern::Regex(QWEN2_SPLIT_REGEX.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|source| TokenizerError::Backend {
            action: "compile the Qwen2 split regex",
            source,
        })?;
        let mut inner = Pipeline::new(model);
        inner.with_pre_tokenizer(Some(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            // The split above already cut the text; this only respells bytes.
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ])));
        // Added tokens are matched on the raw text, before any pre-tokenization.
        let added: Vec<AddedToken> = added.into_iter().map(|t| t.normalized(false)).collect();
        let (special, plain): (Vec<_>, Vec<_>) = added.into_iter().partition(|t| t.special);
        inner.add_special_tokens(&special);
        inner.add_tokens(&plain);

        let mut eos_ids = vec![eos];
        for name in ["<|im_end|>", "<|endoftext|>"] {
            if let Some(id) = inner.token_to_id(name)
                && !eos_ids.contains(&id)
            {
                eos_ids.push(id);
            }
        }
        Ok(Self {
            inner,
            bytes,
            offsets,
            eos,
            bos,
            add_bos,
            eos_ids,
            control,
        })
    }

    /// Token ids for `text`, with BOS first when the vocabulary asks for it. Special-token
    /// text such as `<|im_start|>` encodes as that single token.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let encoding =
            self.inner
                .encode_fast(text, false)
                .map_err(|source| TokenizerError::Backend {
                    action: "encode",
                    source,
                })?;
        let mut ids = Vec::with_capacity(encoding.len() + 1);
        if self.add_bos
            && let Some(bos) = self.bos
        {
            ids.push(bos);
        }
        ids.extend_from_slice(encoding.get_ids());
        Ok(ids)
    }

    /// The text behind `ids`, special tokens included as their text. Bytes that do not form
    /// valid UTF-8 (a character cut between ids) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The text a reader sees behind `ids`: [`decode`](Self::decode) without the control
    /// tokens (`<|im_end|>` and the other chat markup).
    pub fn decode_text(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let visible: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| !self.is_control(id))
            .collect();
        self.decode(&visible)
    }

    /// Whether `id` is a control token (chat markup such as `<|im_end|>`).
    pub fn is_control(&self, id: u32) -> bool {
        self.control.binary_search(&id).is_ok()
    }

    /// A decoder for ids that arrive one at a time, which holds back a character until all
    /// its bytes have arrived.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, false)
    }

    /// [`stream_decoder`](Self::stream_decoder) of the text a reader sees: control tokens
    /// give nothing (as [`decode_text`](Self::decode_text)).
    pub fn stream_text_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self, true)
    }

    /// The raw bytes behind one id.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        let i = id as usize;
        match self.offsets.get(i..i.saturating_add(2)) {
            Some(&[start, end]) => Ok(&self.bytes[start as usize..end as usize]),
            _ => Err(TokenizerError::IdOutOfRange {
                what: "token",
                id,
                vocab_size: self.vocab_size(),
            }),
        }
    }

    /// Ids that end a chat reply: the vocabulary's EOS, then `<|im_end|>` and
    /// `<|endoftext|>` where they exist and differ from it.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// `tokenizer.ggml.eos_token_id`.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// `tokenizer.ggml.bos_token_id`, if the vocabulary has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The id of a vocabulary entry, written as the vocabulary spells it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of ids, equal to the length of the token array it was built from.
    pub fn vocab_size(&self) -> usize {
        self.offsets.len() - 1
    }
}

/// Returns the heap's free pages to the system. glibc keeps freed small blocks resident
/// unless they border the top of the heap; `malloc_trim` releases every whole free page.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_heap() {
    // SAFETY: malloc_trim takes no pointers and only releases memory malloc holds as free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Returns the heap's free pages to the system: nothing to do where the allocator is not
/// glibc's, which is the one known to keep them.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_heap() {}
