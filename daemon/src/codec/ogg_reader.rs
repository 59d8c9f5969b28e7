//! Incremental Ogg page parser and packet assembler (RFC 3533).
//!
//! Bytes arrive in arbitrary runs ([`OggPacketReader::push_bytes`]); complete
//! packets come out of [`OggPacketReader::next_packet`] as slices into a
//! buffer owned by the reader.
//!
//! Invariants:
//! - Memory is fixed at construction: one byte buffer of `max_buffered_bytes`
//!   (unparsed input, at most one partial page after a drain) and one packet
//!   buffer of `max_packet_bytes`. Nothing allocates afterwards.
//! - A page is only interpreted once it is complete and its CRC matches; the
//!   capture pattern, version, header flags and page size are checked as soon
//!   as their bytes arrive, so garbage is rejected without waiting for more.
//! - One logical stream at a time: every page carries the serial of the current
//!   stream, sequence numbers are contiguous, and the "continued packet" flag
//!   agrees with whether a packet is pending. A page with the BOS flag starts a
//!   new (chained) stream; its first completed packet is flagged
//!   `starts_stream`. Multiplexed streams are rejected.
//! - Any error except [`CodecError::BufferFull`] is final for the reader.

use super::error::CodecError;
use super::ogg_crc::ogg_page_crc;

/// Bytes in the fixed part of a page header, before the segment table.
pub const OGG_HEADER_BYTES: usize = 27;
/// The largest page the format allows: full segment table, 255 full segments.
pub const OGG_MAX_PAGE_BYTES: usize = OGG_HEADER_BYTES + 255 + 255 * 255;
/// Page header type flag: the page starts with the continuation of a packet.
pub const OGG_FLAG_CONTINUED: u8 = 0x01;
/// Page header type flag: first page of a logical stream.
pub const OGG_FLAG_BEGIN_OF_STREAM: u8 = 0x02;
/// Page header type flag: last page of a logical stream.
pub const OGG_FLAG_END_OF_STREAM: u8 = 0x04;
const OGG_CAPTURE_PATTERN: &[u8; 4] = b"OggS";

/// Bounds of one reader; all memory is sized from them once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OggReaderConfig {
    /// Largest accepted page, header included (at most [`OGG_MAX_PAGE_BYTES`]
    /// matter; larger values change nothing).
    pub max_page_bytes: usize,
    /// Largest accepted packet, possibly spanning pages.
    pub max_packet_bytes: usize,
    /// Capacity of the input buffer; must be at least `max_page_bytes`. A chunk
    /// that does not fit is refused with [`CodecError::BufferFull`].
    pub max_buffered_bytes: usize,
}

/// A complete packet, borrowed from the reader until the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OggPacket<'a> {
    pub data: &'a [u8],
    /// First packet of a logical stream (its page had the BOS flag, or it is
    /// the first page the reader saw).
    pub starts_stream: bool,
    /// Granule position of the page on which the packet completes.
    pub granule_position: i64,
    /// Sequence number of the page on which the packet completes.
    pub page_sequence: u32,
}

/// The page being split into packets; offsets are relative to its first byte,
/// which is `read_pos` in the byte buffer while the page is current.
#[derive(Debug, Clone, Copy)]
struct PageCursor {
    page_bytes: usize,
    segment_count: usize,
    next_segment: usize,
    body_offset: usize,
    sequence: u32,
    granule_position: i64,
}

/// Incremental Ogg reader for one session.
pub struct OggPacketReader {
    config: OggReaderConfig,
    buf: Box<[u8]>,
    read_pos: usize,
    write_pos: usize,
    page: Option<PageCursor>,
    packet: Box<[u8]>,
    /// Bytes of the packet being assembled (a pending packet is never empty).
    packet_bytes: usize,
    /// The packet in `packet` was handed out; clear it on the next call.
    packet_returned: bool,
    serial: Option<u32>,
    next_sequence: u32,
    end_of_stream_seen: bool,
    stream_start_pending: bool,
    failed: bool,
}

impl OggPacketReader {
    pub fn new(config: OggReaderConfig) -> Result<Self, CodecError> {
        if config.max_page_bytes < OGG_HEADER_BYTES {
            return Err(CodecError::InvalidConfig(
                "max_page_bytes is smaller than a page header",
            ));
        }
        if config.max_buffered_bytes < config.max_page_bytes {
            return Err(CodecError::InvalidConfig(
                "max_buffered_bytes is smaller than max_page_bytes",
            ));
        }
        if config.max_packet_bytes == 0 {
            return Err(CodecError::InvalidConfig("max_packet_bytes is 0"));
        }
        Ok(Self {
            config,
            buf: vec![0u8; config.max_buffered_bytes].into_boxed_slice(),
            read_pos: 0,
            write_pos: 0,
            page: None,
            packet: vec![0u8; config.max_packet_bytes].into_boxed_slice(),
            packet_bytes: 0,
            packet_returned: false,
            serial: None,
            next_sequence: 0,
            end_of_stream_seen: false,
            stream_start_pending: false,
            failed: false,
        })
    }

    pub fn config(&self) -> &OggReaderConfig {
        &self.config
    }

    /// Forgets all stream state (for reuse by a new session); keeps the buffers.
    pub fn reset(&mut self) {
        self.read_pos = 0;
        self.write_pos = 0;
        self.page = None;
        self.packet_bytes = 0;
        self.packet_returned = false;
        self.serial = None;
        self.next_sequence = 0;
        self.end_of_stream_seen = false;
        self.stream_start_pending = false;
        self.failed = false;
    }

    /// Bytes received but not yet turned into packets.
    pub fn buffered_bytes(&self) -> usize {
        self.write_pos - self.read_pos
    }

    /// Appends a run of stream bytes (any length, any alignment to pages).
    ///
    /// Refuses the whole chunk with [`CodecError::BufferFull`] when it does not
    /// fit in what `next_packet` has not consumed yet.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Result<(), CodecError> {
        if self.failed {
            return Err(CodecError::StreamFailed);
        }
        if bytes.is_empty() {
            return Ok(());
        }
        if bytes.len() > self.buf.len() - self.write_pos && self.read_pos > 0 {
            // Compact: move the unread bytes (at most one partial page after a
            // drain) to the front. Page offsets are relative, so stay valid.
            self.buf.copy_within(self.read_pos..self.write_pos, 0);
            self.write_pos -= self.read_pos;
            self.read_pos = 0;
        }
        if bytes.len() > self.buf.len() - self.write_pos {
            return Err(CodecError::BufferFull {
                buffered_bytes: self.buffered_bytes(),
                incoming_bytes: bytes.len(),
                max_buffered_bytes: self.buf.len(),
            });
        }
        self.buf[self.write_pos..self.write_pos + bytes.len()].copy_from_slice(bytes);
        self.write_pos += bytes.len();
        Ok(())
    }

    /// The next complete packet, or `None` until more bytes arrive.
    pub fn next_packet(&mut self) -> Result<Option<OggPacket<'_>>, CodecError> {
        if self.failed {
            return Err(CodecError::StreamFailed);
        }
        if self.packet_returned {
            self.packet_returned = false;
            self.packet_bytes = 0;
        }
        loop {
            if let Some(cursor) = self.page.as_mut() {
                let page = &self.buf[self.read_pos..self.read_pos + cursor.page_bytes];
                while cursor.next_segment < cursor.segment_count {
                    let lacing = page[OGG_HEADER_BYTES + cursor.next_segment] as usize;
                    let segment = &page[cursor.body_offset..cursor.body_offset + lacing];
                    cursor.next_segment += 1;
                    cursor.body_offset += lacing;
                    let packet_end = self.packet_bytes + lacing;
                    if packet_end > self.packet.len() {
                        self.failed = true;
                        return Err(CodecError::PacketTooLarge {
                            max_packet_bytes: self.packet.len(),
                        });
                    }
                    self.packet[self.packet_bytes..packet_end].copy_from_slice(segment);
                    self.packet_bytes = packet_end;
                    if lacing < 255 {
                        self.packet_returned = true;
                        let starts_stream = std::mem::take(&mut self.stream_start_pending);
                        return Ok(Some(OggPacket {
                            data: &self.packet[..self.packet_bytes],
                            starts_stream,
                            granule_position: cursor.granule_position,
                            page_sequence: cursor.sequence,
                        }));
                    }
                }
                // Page exhausted; a packet ending in a 255 lacing stays pending.
                self.read_pos += cursor.page_bytes;
                self.page = None;
                if self.read_pos == self.write_pos {
                    self.read_pos = 0;
                    self.write_pos = 0;
                }
                continue;
            }
            match self.start_page() {
                Ok(true) => continue,
                Ok(false) => return Ok(None),
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            }
        }
    }

    /// Validates the page at `read_pos` and makes it current. `Ok(false)` when
    /// its bytes have not all arrived yet.
    fn start_page(&mut self) -> Result<bool, CodecError> {
        let avail = &self.buf[self.read_pos..self.write_pos];
        let Some((header_bytes, page_bytes)) = page_extent(avail, self.config.max_page_bytes)?
        else {
            return Ok(false);
        };
        let page = &avail[..page_bytes];
        let sequence = le_u32(&page[18..22]);
        let expected_crc = le_u32(&page[22..26]);
        let computed_crc = ogg_page_crc(page);
        if expected_crc != computed_crc {
            return Err(CodecError::CrcMismatch {
                sequence,
                expected: expected_crc,
                computed: computed_crc,
            });
        }
        let segment_count = page[26] as usize;
        let header_type = page[5];
        let granule_position = i64::from_le_bytes(page[6..14].try_into().unwrap_or([0; 8]));
        let serial = le_u32(&page[14..18]);
        self.check_stream_order(serial, sequence, header_type)?;
        self.end_of_stream_seen = header_type & OGG_FLAG_END_OF_STREAM != 0;
        self.next_sequence = sequence.wrapping_add(1);
        self.page = Some(PageCursor {
            page_bytes,
            segment_count,
            next_segment: 0,
            body_offset: header_bytes,
            sequence,
            granule_position,
        });
        Ok(true)
    }

    /// Checks that a page (CRC already verified) continues the current
    /// logical stream: same serial, next sequence number, not after the
    /// end of stream, and a "continued" flag that agrees with whether a
    /// packet is pending. A BOS page (or the first page seen) starts a new
    /// stream instead, which it may only do between packets.
    fn check_stream_order(
        &mut self,
        serial: u32,
        sequence: u32,
        header_type: u8,
    ) -> Result<(), CodecError> {
        let continued = header_type & OGG_FLAG_CONTINUED != 0;
        let begins_stream = header_type & OGG_FLAG_BEGIN_OF_STREAM != 0;
        let packet_pending = self.packet_bytes > 0;
        match self.serial {
            Some(current) if !begins_stream => {
                if serial != current {
                    return Err(CodecError::UnexpectedSerial {
                        expected: current,
                        found: serial,
                    });
                }
                if self.end_of_stream_seen {
                    return Err(CodecError::PageAfterEndOfStream { sequence });
                }
                if sequence != self.next_sequence {
                    return Err(CodecError::SequenceGap {
                        expected: self.next_sequence,
                        found: sequence,
                    });
                }
            }
            // First page seen, or a BOS page: a new (possibly chained) stream.
            _ => {
                if packet_pending || continued {
                    return Err(CodecError::ContinuationMismatch {
                        sequence,
                        page_continued: continued,
                        packet_pending,
                    });
                }
                self.serial = Some(serial);
                self.end_of_stream_seen = false;
                self.stream_start_pending = true;
            }
        }
        if continued != packet_pending {
            return Err(CodecError::ContinuationMismatch {
                sequence,
                page_continued: continued,
                packet_pending,
            });
        }
        Ok(())
    }
}

/// The framing of the page that starts `avail`: `(header_bytes,
/// page_bytes)`, or `None` while its bytes have not all arrived. The
/// capture pattern, version, header flags and sizes are checked as soon as
/// their bytes are there, so garbage fails without waiting for more.
fn page_extent(avail: &[u8], max_page_bytes: usize) -> Result<Option<(usize, usize)>, CodecError> {
    let prefix = avail.len().min(OGG_CAPTURE_PATTERN.len());
    if avail[..prefix] != OGG_CAPTURE_PATTERN[..prefix] {
        let mut found = [0u8; 4];
        found[..prefix].copy_from_slice(&avail[..prefix]);
        return Err(CodecError::BadCapturePattern { found });
    }
    if avail.len() > 4 && avail[4] != 0 {
        return Err(CodecError::UnsupportedOggVersion { version: avail[4] });
    }
    if avail.len() > 5 && avail[5] & !0x07 != 0 {
        return Err(CodecError::BadHeaderType {
            header_type: avail[5],
        });
    }
    if avail.len() < OGG_HEADER_BYTES {
        return Ok(None);
    }
    let segment_count = avail[26] as usize;
    let header_bytes = OGG_HEADER_BYTES + segment_count;
    if header_bytes > max_page_bytes {
        return Err(CodecError::PageTooLarge {
            page_bytes: header_bytes,
            max_page_bytes,
        });
    }
    if avail.len() < header_bytes {
        return Ok(None);
    }
    let body_bytes: usize = avail[OGG_HEADER_BYTES..header_bytes]
        .iter()
        .map(|&l| l as usize)
        .sum();
    let page_bytes = header_bytes + body_bytes;
    if page_bytes > max_page_bytes {
        return Err(CodecError::PageTooLarge {
            page_bytes,
            max_page_bytes,
        });
    }
    if avail.len() < page_bytes {
        return Ok(None);
    }
    Ok(Some((header_bytes, page_bytes)))
}

#[inline]
fn le_u32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes.try_into().unwrap_or([0; 4]))
}
