//! Uses dg-engine as an app would: a synthetic checkpoint, the loader builder, chained request
//! options with a stop string, the stream iterator, a batch and the scheduler.

use std::sync::Arc;

use dg_engine::{
    DiffusionGemma, Event, FinishReason, Message, Request, Sampler, Scheduler, SchedulerOptions,
    Update,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("dg-downstream-{}", std::process::id()));
    dg_engine::synthetic::write_checkpoint(&dir, &Default::default())?;
    let model = Arc::new(DiffusionGemma::builder(&dir).threads(2).load()?);

    let request = Request::chat(vec![Message::user("Write about the sea.")])
        .max_tokens(48)
        .sampler(Sampler::EntropyBound { bound: None })
        .seed(7);
    let full = model.generate(&request)?;

    // The same request as an iterator of updates.
    let mut streamed = String::new();
    let mut result = None;
    for update in model.stream(request.clone())? {
        match update {
            Update::Event(Event::Text(t)) => streamed.push_str(&t),
            Update::Done(g) => result = Some(g),
            Update::Failed(e) => return Err(e.into()),
            _ => {}
        }
    }
    let result = result.ok_or("no result")?;
    assert_eq!(result.token_ids, full.token_ids);
    assert_eq!(streamed, full.text);

    // A stop string taken from the answer cuts it there.
    let chars: Vec<char> = full.text.chars().collect();
    if chars.len() >= 12 {
        let stop: String = chars[8..12].iter().collect();
        let cut = full.text.find(&stop).ok_or("stop not found")?;
        let stopped = model.generate(&request.clone().stop([stop.clone()]))?;
        assert_eq!(stopped.finish_reason, FinishReason::StopSequence);
        assert_eq!(stopped.text, full.text[..cut]);
    }

    // A batch and the scheduler give the same tokens.
    let batch = model.generate_batch(&[request.clone(), request.clone().seed(8)])?;
    assert_eq!(batch[0].token_ids, full.token_ids);
    let scheduler = Scheduler::start(model.clone(), SchedulerOptions::default())?;
    let scheduled = scheduler.submit(request)?.wait()?;
    assert_eq!(scheduled.token_ids, full.token_ids);

    std::fs::remove_dir_all(&dir)?;
    println!(
        "downstream: ok ({} tokens, {} streamed bytes)",
        full.token_ids.len(),
        streamed.len()
    );
    Ok(())
}
