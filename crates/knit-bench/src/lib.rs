//! Reading what `bench/scale.sh` writes (`samples.csv`), for its chart
//! (`cargo run -p knit-bench --example scale_chart -- CSV PNG N`).

use std::path::{Path, PathBuf};

/// One line of `samples.csv`: the time from the scale request and what the
/// sampler saw then (`None` where a read failed and the cell is empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub t_s: f64,
    pub phase: String,
    pub instances: u32,
    pub nodes: Option<u32>,
    pub ready: Option<u32>,
    pub server_cpu_pct: Option<f64>,
    pub server_rss_mib: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum SamplesError {
    #[error("BenchSamplesIo: {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("BenchSamplesHeader: {path}: column {column:?} missing from the header")]
    Header { path: PathBuf, column: &'static str },
    #[error(
        "BenchSamplesValue: {path} line {line}: column {column}: value {value:?} is not a number"
    )]
    Value {
        path: PathBuf,
        line: usize,
        column: &'static str,
        value: String,
    },
}

impl SamplesError {
    /// Stable code for scripts.
    pub fn code(&self) -> &'static str {
        match self {
            SamplesError::Io { .. } => "BenchSamplesIo",
            SamplesError::Header { .. } => "BenchSamplesHeader",
            SamplesError::Value { .. } => "BenchSamplesValue",
        }
    }
}

/// The samples file is small (one line a second); larger is not ours.
const MAX_BYTES: u64 = 64 << 20;

pub fn read_samples(path: &Path) -> Result<Vec<Sample>, SamplesError> {
    let io = |source| SamplesError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_BYTES {
        return Err(io(std::io::Error::other(format!(
            "{len} bytes, more than {MAX_BYTES}"
        ))));
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    parse_samples(path, &text)
}

pub fn parse_samples(path: &Path, text: &str) -> Result<Vec<Sample>, SamplesError> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let col = |column: &'static str| {
        header
            .iter()
            .position(|h| *h == column)
            .ok_or(SamplesError::Header {
                path: path.to_path_buf(),
                column,
            })
    };
    let (t, phase, inst, nodes, ready, cpu, rss) = (
        col("t_s")?,
        col("phase")?,
        col("instances")?,
        col("nodes")?,
        col("ready")?,
        col("server_cpu_pct")?,
        col("server_rss_mib")?,
    );
    let mut out = Vec::new();
    for (i, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let cells: Vec<&str> = line.split(',').collect();
        let cell = |at: usize| cells.get(at).copied().unwrap_or("").trim();
        let bad = |column: &'static str, value: &str| SamplesError::Value {
            path: path.to_path_buf(),
            line: i + 2,
            column,
            value: value.to_string(),
        };
        let opt = |at: usize, column: &'static str| -> Result<Option<f64>, SamplesError> {
            match cell(at) {
                "" => Ok(None),
                v => v.parse::<f64>().map(Some).map_err(|_| bad(column, v)),
            }
        };
        let count = |at: usize, column: &'static str| -> Result<Option<u32>, SamplesError> {
            match cell(at) {
                "" => Ok(None),
                v => v.parse::<u32>().map(Some).map_err(|_| bad(column, v)),
            }
        };
        out.push(Sample {
            t_s: opt(t, "t_s")?.ok_or_else(|| bad("t_s", ""))?,
            phase: cell(phase).to_string(),
            instances: count(inst, "instances")?.unwrap_or(0),
            nodes: count(nodes, "nodes")?,
            ready: count(ready, "ready")?,
            server_cpu_pct: opt(cpu, "server_cpu_pct")?,
            server_rss_mib: opt(rss, "server_rss_mib")?,
        });
    }
    Ok(out)
}

/// A TrueType font for the chart's text: `KNIT_CHART_FONT`, else the first
/// of the common sans fonts Debian ships (fonts-liberation, fonts-dejavu).
pub fn find_font() -> Option<PathBuf> {
    const CANDIDATES: &[&str] = &[
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    ];
    std::env::var_os("KNIT_CHART_FONT")
        .map(PathBuf::from)
        .into_iter()
        .chain(CANDIDATES.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "t_s,epoch_ms,phase,instances,nodes,ready,bridge_ports,loops,server_cpu_pct,server_rss_mib,host_mem_used_mib,host_load1,kubectl_ms";

    #[test]
    fn reads_the_samples_with_empty_cells() {
        let text = format!(
            "{HEADER}\n-3.000,1,idle,0,0,0,0,0,,51.0,900,1.0,300\n2.500,2,out,3,,,3,3,29.5,60.1,950,2.0,310\n"
        );
        let s = parse_samples(Path::new("s.csv"), &text).expect("parses");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].t_s, -3.0);
        assert_eq!(s[0].server_cpu_pct, None);
        assert_eq!(s[1].phase, "out");
        assert_eq!(s[1].instances, 3);
        assert_eq!(s[1].ready, None);
        assert_eq!(s[1].server_cpu_pct, Some(29.5));
    }

    #[test]
    fn names_the_column_and_value_it_cannot_read() {
        let e = parse_samples(Path::new("s.csv"), "t_s,phase\n1,out\n").unwrap_err();
        assert_eq!(e.code(), "BenchSamplesHeader");
        assert!(e.to_string().contains("\"instances\""), "{e}");
        let text = format!("{HEADER}\n1.0,1,out,x,0,0,0,0,1,1,1,1,1\n");
        let e = parse_samples(Path::new("s.csv"), &text).unwrap_err();
        assert_eq!(e.code(), "BenchSamplesValue");
        let msg = e.to_string();
        assert!(
            msg.contains("line 2") && msg.contains("instances") && msg.contains("\"x\""),
            "{msg}"
        );
    }
}
