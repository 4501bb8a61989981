//! The Qwen2.5 chat prompt for one user turn.
//!
//! This is the one-turn, no-tools path of the Jinja template in the Qwen2.5(-Coder) GGUF's
//! `tokenizer.chat_template`, written out by hand so that no template engine is needed:
//! a system turn (the given one, or the template's default when there is none), the user
//! turn, then the opening of the assistant turn (`add_generation_prompt=True`). The test
//! `chat_prompt_matches_jinja` compares it with the template as rendered by transformers.

/// The system prompt the template inserts when the conversation has none.
pub const DEFAULT_SYSTEM_PROMPT: &str =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

/// The prompt text for one user turn, ready to encode: each turn is framed by
/// `<|im_start|>{role}\n` and `<|im_end|>\n`, and the text ends where the assistant's reply
/// begins. `system: None` uses [`DEFAULT_SYSTEM_PROMPT`]; `Some("")` is an empty system turn,
/// as the template renders it.
pub fn chat_prompt(system: Option<&str>, user: &str) -> String {
    let system = system.unwrap_or(DEFAULT_SYSTEM_PROMPT);
    let mut prompt = String::with_capacity(system.len() + user.len() + 64);
    for (role, content) in [("system", system), ("user", user)] {
        prompt.push_str("<|im_start|>");
        prompt.push_str(role);
        prompt.push('\n');
        prompt.push_str(content);
        prompt.push_str("<|im_end|>\n");
    }
    prompt.push_str("<|im_start|>assistant\n");
    prompt
}
