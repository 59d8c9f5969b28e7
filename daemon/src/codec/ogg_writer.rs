//! Ogg page writer: one packet per page, written into a caller's byte slice.
//!
//! Invariants: one serial per writer; sequence numbers start at 0 and grow by
//! one per page; the first page written carries the BOS flag; each page holds
//! exactly one complete packet (no continuation), so a packet is at most
//! [`OGG_MAX_SINGLE_PAGE_PACKET_BYTES`]; the CRC is filled in. Nothing
//! allocates.

use super::error::CodecError;
use super::ogg_crc::ogg_page_crc;
use super::ogg_reader::{OGG_FLAG_BEGIN_OF_STREAM, OGG_HEADER_BYTES};

/// Largest packet that fits on one page: 254 segments of 255 bytes and a
/// final segment of 254 (a multiple of 255 needs a terminating 0 lacing).
pub const OGG_MAX_SINGLE_PAGE_PACKET_BYTES: usize = 255 * 255 - 1;

/// Size of the page that carries one packet of `packet_bytes`.
pub const fn ogg_page_bytes_for_packet(packet_bytes: usize) -> usize {
    OGG_HEADER_BYTES + packet_bytes / 255 + 1 + packet_bytes
}

/// Writes the pages of one logical stream.
#[derive(Debug, Clone)]
pub struct OggPageWriter {
    serial: u32,
    next_sequence: u32,
}

impl OggPageWriter {
    pub fn new(serial: u32) -> Self {
        Self {
            serial,
            next_sequence: 0,
        }
    }

    pub fn serial(&self) -> u32 {
        self.serial
    }

    /// Pages written so far.
    pub fn pages_written(&self) -> u32 {
        self.next_sequence
    }

    /// Writes one page holding `packet` at the start of `out`; returns the page
    /// size. `extra_flags` may add the EOS flag; BOS is set on the first page.
    pub fn write_page(
        &mut self,
        out: &mut [u8],
        packet: &[u8],
        granule_position: u64,
        extra_flags: u8,
    ) -> Result<usize, CodecError> {
        if packet.len() > OGG_MAX_SINGLE_PAGE_PACKET_BYTES {
            return Err(CodecError::PacketTooLarge {
                max_packet_bytes: OGG_MAX_SINGLE_PAGE_PACKET_BYTES,
            });
        }
        let segment_count = packet.len() / 255 + 1;
        let page_bytes = OGG_HEADER_BYTES + segment_count + packet.len();
        if out.len() < page_bytes {
            return Err(CodecError::OutputTooSmall {
                available_bytes: out.len(),
                required_bytes: page_bytes,
            });
        }
        let mut header_type = extra_flags & !OGG_FLAG_BEGIN_OF_STREAM;
        if self.next_sequence == 0 {
            header_type |= OGG_FLAG_BEGIN_OF_STREAM;
        }
        let page = &mut out[..page_bytes];
        page[0..4].copy_from_slice(b"OggS");
        page[4] = 0; // stream structure version
        page[5] = header_type;
        page[6..14].copy_from_slice(&granule_position.to_le_bytes());
        page[14..18].copy_from_slice(&self.serial.to_le_bytes());
        page[18..22].copy_from_slice(&self.next_sequence.to_le_bytes());
        page[22..26].fill(0);
        page[26] = segment_count as u8;
        let lacing = &mut page[OGG_HEADER_BYTES..OGG_HEADER_BYTES + segment_count];
        lacing.fill(255);
        lacing[segment_count - 1] = (packet.len() % 255) as u8;
        page[OGG_HEADER_BYTES + segment_count..].copy_from_slice(packet);
        let crc = ogg_page_crc(page);
        page[22..26].copy_from_slice(&crc.to_le_bytes());
        self.next_sequence = self.next_sequence.wrapping_add(1);
        Ok(page_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::ogg_reader::{OggPacketReader, OggReaderConfig};

    #[test]
    fn pages_round_trip_through_the_reader() {
        let sizes = [
            0usize,
            1,
            254,
            255,
            256,
            510,
            1000,
            OGG_MAX_SINGLE_PAGE_PACKET_BYTES,
        ];
        let mut writer = OggPageWriter::new(0xdead_beef);
        let mut stream = Vec::new();
        let mut page = vec![0u8; OGG_MAX_SINGLE_PAGE_PACKET_BYTES + 400];
        for (i, &n) in sizes.iter().enumerate() {
            let packet: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
            let written = writer
                .write_page(&mut page, &packet, i as u64 * 960, 0)
                .unwrap();
            assert_eq!(written, ogg_page_bytes_for_packet(n));
            stream.extend_from_slice(&page[..written]);
        }
        let mut reader = OggPacketReader::new(OggReaderConfig {
            max_page_bytes: 70_000,
            max_packet_bytes: 70_000,
            max_buffered_bytes: 200_000,
        })
        .unwrap();
        reader.push_bytes(&stream).unwrap();
        for (i, &n) in sizes.iter().enumerate() {
            let p = reader.next_packet().unwrap().unwrap();
            assert_eq!(p.data.len(), n);
            assert!(p
                .data
                .iter()
                .enumerate()
                .all(|(j, &b)| b == (i * 31 + j) as u8));
            assert_eq!(p.starts_stream, i == 0);
            assert_eq!(p.granule_position, i as i64 * 960);
            assert_eq!(p.page_sequence, i as u32);
        }
        assert!(reader.next_packet().unwrap().is_none());
    }

    #[test]
    fn refuses_small_output_and_huge_packets() {
        let mut writer = OggPageWriter::new(1);
        let mut out = [0u8; 40];
        assert!(matches!(
            writer.write_page(&mut out, &[0u8; 20], 0, 0),
            Err(CodecError::OutputTooSmall {
                required_bytes: 48,
                ..
            })
        ));
        let big = vec![0u8; OGG_MAX_SINGLE_PAGE_PACKET_BYTES + 1];
        let mut out = vec![0u8; 70_000];
        assert!(matches!(
            writer.write_page(&mut out, &big, 0, 0),
            Err(CodecError::PacketTooLarge { .. })
        ));
        assert_eq!(writer.pages_written(), 0);
    }
}
