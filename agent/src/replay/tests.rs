//! Tests of the replay ring: offsets, loss reports, merging, backpressure and wakeups.

use super::*;
use futures_util::FutureExt;

fn ring(capacity: usize) -> Arc<Ring> {
    Arc::new(Ring::new(capacity))
}

/// Reads everything currently available, asserting there is no gap.
fn drain(reader: &mut Reader) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(Read::Data(bytes)) = reader.try_read_into(usize::MAX, BytesMut::with_capacity) {
        out.extend_from_slice(&bytes);
        reader.advance(bytes.len());
    }
    out
}

#[test]
fn reads_from_any_retained_offset() {
    let r = ring(1 << 20);
    r.push(Bytes::from_static(b"hello "));
    r.push(Bytes::from(vec![b'x'; MERGE_BELOW]));
    r.push(Bytes::from_static(b"world"));
    assert_eq!(r.end(), 11 + MERGE_BELOW as u64);
    let mut reader = r.attach(3).unwrap();
    assert_eq!(reader.offset(), 3);
    let got = drain(&mut reader);
    assert_eq!(&got[..3], b"lo ");
    assert_eq!(&got[got.len() - 5..], b"world");
    assert_eq!(got.len(), 8 + MERGE_BELOW);
    assert!(r.attach(r.end() + 1).is_none());
    assert!(r.attach(r.end()).is_some());
}

#[test]
fn reads_respect_max() {
    let r = ring(100);
    r.push(Bytes::from_static(b"abcdef"));
    let mut reader = r.attach(1).unwrap();
    assert_eq!(
        reader.try_read_into(2, BytesMut::with_capacity),
        Some(Read::Data(BytesMut::from(&b"bc"[..])))
    );
    // Not advanced: the same bytes again.
    assert_eq!(
        reader.try_read_into(2, BytesMut::with_capacity),
        Some(Read::Data(BytesMut::from(&b"bc"[..])))
    );
}

#[test]
fn a_read_into_pieces_shares_the_rings_memory() {
    let r = ring(1 << 20);
    let big = Bytes::from(vec![b'x'; MERGE_BELOW]);
    let other = Bytes::from(vec![b'y'; MERGE_BELOW]);
    r.push(big.clone());
    r.push(other.clone());
    let mut reader = r.attach(1).unwrap();
    // From inside the first chunk, to inside the second: two pieces, no copy.
    let Some(Read::Data(pieces)) = reader.try_read_into(MERGE_BELOW, |_| Vec::new()) else {
        panic!("data expected")
    };
    assert_eq!(pieces.len(), 2);
    assert_eq!(pieces[0].as_ptr(), big[1..].as_ptr());
    assert_eq!(pieces[1].as_ptr(), other.as_ptr());
    assert_eq!(pieces.iter().map(Bytes::len).sum::<usize>(), MERGE_BELOW);
    assert_eq!(pieces[1].len(), 1);
}

#[test]
fn one_read_gathers_many_chunks_after_the_buffers_prefix() {
    let r = ring(1 << 20);
    let big = vec![b'x'; MERGE_BELOW];
    r.push(Bytes::from_static(b"ab"));
    r.push(Bytes::from(big.clone()));
    r.push(Bytes::from(big));
    r.push(Bytes::from_static(b"cd"));
    assert!(r.lock().chunks.len() >= 3, "the chunks must stay apart");
    let mut reader = r.attach(1).unwrap();
    let prefixed = |len: usize| {
        let mut buf = BytesMut::with_capacity(2 + len);
        buf.extend_from_slice(b"<>");
        buf
    };
    let Some(Read::Data(got)) = reader.try_read_into(usize::MAX, prefixed) else {
        panic!("data expected")
    };
    assert_eq!(got.len(), 2 + 1 + 2 * MERGE_BELOW + 2);
    assert_eq!(&got[..3], b"<>b");
    assert_eq!(&got[got.len() - 3..], b"xcd");
    // Bounded by max, the copy stops inside a chunk.
    let Some(Read::Data(part)) = reader.try_read_into(5, BytesMut::with_capacity) else {
        panic!("data expected")
    };
    assert_eq!(&part[..], b"bxxxx");
}

#[test]
fn overflow_reports_the_dropped_range_then_continues() {
    let r = ring(10);
    for chunk in [&b"0123456789"[..], b"abcdefghij", b"ABCDE"] {
        r.push(Bytes::copy_from_slice(chunk));
    }
    // 25 bytes written, 10 kept: 15..25.
    let mut reader = r.attach(0).unwrap();
    assert_eq!(reader.offset(), 15);
    assert_eq!(
        reader.try_read_into(100, BytesMut::with_capacity),
        Some(Read::Dropped { from: 0, to: 15 })
    );
    assert_eq!(drain(&mut reader), b"fghijABCDE");
    r.close();
    assert_eq!(
        reader.try_read_into(100, BytesMut::with_capacity),
        Some(Read::End)
    );
}

#[test]
fn wraps_around_many_times_keeping_exactly_capacity() {
    let r = ring(1000);
    let mut all = Vec::new();
    for i in 0..500u32 {
        let chunk: Vec<u8> = (0..(i % 97 + 1)).map(|j| (i + j) as u8).collect();
        all.extend_from_slice(&chunk);
        r.push(Bytes::from(chunk));
    }
    let end = r.end();
    assert_eq!(end, all.len() as u64);
    let mut reader = r.attach(end - 1000).unwrap();
    assert_eq!(drain(&mut reader), &all[all.len() - 1000..]);
    let mut early = r.attach(end - 1001).unwrap();
    assert_eq!(
        early.try_read_into(10, BytesMut::with_capacity),
        Some(Read::Dropped {
            from: end - 1001,
            to: end - 1000
        })
    );
}

#[test]
fn small_chunks_are_merged() {
    let r = ring(1 << 20);
    for _ in 0..10_000 {
        r.push(Bytes::from_static(b"x"));
    }
    let chunks = r.lock().chunks.len();
    assert!(chunks <= 2, "{chunks} chunks");
    let mut reader = r.attach(0).unwrap();
    assert_eq!(drain(&mut reader).len(), 10_000);
}

#[test]
fn without_readers_the_writer_never_waits() {
    let r = ring(10);
    assert_eq!(r.room().now_or_never(), Some(usize::MAX));
    r.push(Bytes::from(vec![0; 100]));
    assert_eq!(r.room().now_or_never(), Some(usize::MAX));
}

#[test]
fn an_attached_reader_holds_the_writer_back() {
    let r = ring(10);
    let mut reader = r.attach(0).unwrap();
    assert_eq!(r.room().now_or_never(), Some(10));
    r.push(Bytes::from_static(b"0123456"));
    assert_eq!(r.room().now_or_never(), Some(3));
    r.push(Bytes::from_static(b"789"));
    assert_eq!(r.room().now_or_never(), None, "full: the writer must wait");

    let mut waiting = Box::pin(r.room());
    assert!((&mut waiting).now_or_never().is_none());
    let Some(Read::Data(bytes)) = reader.try_read_into(4, BytesMut::with_capacity) else {
        panic!("data expected")
    };
    assert_eq!(&bytes[..], b"0123");
    reader.advance(4);
    assert_eq!(waiting.now_or_never(), Some(4));

    // Detaching releases the writer entirely.
    drop(reader);
    assert_eq!(r.room().now_or_never(), Some(usize::MAX));
}

#[test]
fn unread_bytes_survive_a_push_beyond_capacity() {
    // A writer that read more than it had room for (a reader attached meanwhile)
    // must not trim what that reader still needs.
    let r = ring(4);
    let mut reader = r.attach(0).unwrap();
    r.push(Bytes::from_static(b"abcdefgh"));
    assert_eq!(drain(&mut reader), b"abcdefgh");
    drop(reader);
    r.push(Bytes::from_static(b"ij"));
    let mut late = r.attach(0).unwrap();
    assert_eq!(
        late.try_read_into(100, BytesMut::with_capacity),
        Some(Read::Dropped { from: 0, to: 6 })
    );
    assert_eq!(drain(&mut late), b"ghij");
}

#[tokio::test]
async fn readers_wake_on_data_and_close() {
    let r = ring(100);
    let mut reader = r.attach(0).unwrap();
    let writer = {
        let r = r.clone();
        tokio::spawn(async move {
            r.push(Bytes::from_static(b"hi"));
            r.close();
        })
    };
    assert_eq!(
        reader.read_into(100, BytesMut::with_capacity).await,
        Read::Data(BytesMut::from(&b"hi"[..]))
    );
    reader.advance(2);
    assert_eq!(
        reader.read_into(100, BytesMut::with_capacity).await,
        Read::End
    );
    writer.await.unwrap();
}
