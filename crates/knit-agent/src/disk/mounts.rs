//! The mount table as this process sees it (`/proc/self/mountinfo`).

use std::fs;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// `major:minor` of the mounted device.
    pub dev_id: String,
    /// Path inside the mounted filesystem that is mounted (`/` unless a bind of a subdirectory).
    pub root: String,
    pub mount_point: String,
    pub fs_type: String,
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Ok(code) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(code as char);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    out
}

pub fn mounts() -> Vec<MountEntry> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            Some(MountEntry {
                dev_id: fields.get(2)?.to_string(),
                root: unescape(fields.get(3)?),
                mount_point: unescape(fields.get(4)?),
                fs_type: fields.get(sep + 1)?.to_string(),
            })
        })
        .collect()
}

/// The last mount on `path` (the one visible there), if any.
pub fn mounted_at(path: &str) -> Option<MountEntry> {
    mounts().into_iter().rev().find(|m| m.mount_point == path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn unescapes_octal() {
        assert_eq!(super::unescape("/a\\040b"), "/a b");
        assert_eq!(super::unescape("/plain"), "/plain");
    }
}
