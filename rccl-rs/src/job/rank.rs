//! This process's rank and the world size, from the variables of the
//! launchers in use.

use crate::error::{Error, Result};

/// This process's rank and the world size, from the variables of the
/// launchers in use: torchrun (`RANK`, `WORLD_SIZE`), Slurm
/// (`SLURM_PROCID`, `SLURM_NTASKS`), OpenMPI (`OMPI_COMM_WORLD_RANK`,
/// `OMPI_COMM_WORLD_SIZE`) and MPICH / Hydra (`PMI_RANK`, `PMI_SIZE`).
pub fn rank_from_env() -> Result<(usize, usize)> {
    launcher_rank_from_env()?.ok_or_else(|| {
        Error::InvalidArgument(
            "no rank in the environment: set RANK and WORLD_SIZE (or run under torchrun, Slurm or mpirun)"
                .into(),
        )
    })
}

/// As [`rank_from_env`], `None` where no launcher set both of its
/// variables. A variable that is set must hold a rank of the job: a value
/// that is not a number, a world size of 0 or a rank beyond it is an error
/// naming the variable and its value.
pub fn launcher_rank_from_env() -> Result<Option<(usize, usize)>> {
    launcher_rank(|name| std::env::var(name).ok())
}

/// [`launcher_rank_from_env`] with the variables looked up through `var`.
fn launcher_rank(var: impl Fn(&str) -> Option<String>) -> Result<Option<(usize, usize)>> {
    let number = |name: &str, expected: &str| -> Result<Option<usize>> {
        var(name)
            .map(|text| {
                text.trim().parse().map_err(|_| {
                    Error::InvalidArgument(format!("{name}={text:?} is not {expected}"))
                })
            })
            .transpose()
    };
    for (rank_var, size_var) in [
        ("RANK", "WORLD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
        ("PMI_RANK", "PMI_SIZE"),
        ("SLURM_PROCID", "SLURM_NTASKS"),
    ] {
        let rank = number(rank_var, "a rank (a whole number from 0)")?;
        let size = number(size_var, "a number of ranks (a whole number from 1)")?;
        let (Some(rank), Some(size)) = (rank, size) else {
            continue;
        };
        if size == 0 {
            return Err(Error::InvalidArgument(format!(
                "{size_var}=0: a job has at least one rank"
            )));
        }
        if rank >= size {
            return Err(Error::InvalidArgument(format!(
                "{rank_var}={rank} is out of range for {size_var}={size} (ranks 0 to {})",
                size - 1
            )));
        }
        return Ok(Some((rank, size)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank_of(vars: &[(&str, &str)]) -> Result<Option<(usize, usize)>> {
        launcher_rank(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn launcher_ranks_are_read_in_order_and_half_set_pairs_skipped() {
        assert_eq!(rank_of(&[]), Ok(None));
        assert_eq!(
            rank_of(&[("RANK", "1"), ("WORLD_SIZE", "2")]),
            Ok(Some((1, 2)))
        );
        assert_eq!(
            rank_of(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", " 4 ")]),
            Ok(Some((3, 4)))
        );
        // A batch script's own Slurm step: a rank without a world size.
        assert_eq!(rank_of(&[("SLURM_PROCID", "0")]), Ok(None));
        assert_eq!(
            rank_of(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("OMPI_COMM_WORLD_RANK", "5"),
                ("OMPI_COMM_WORLD_SIZE", "8"),
            ]),
            Ok(Some((0, 2)))
        );
    }

    #[test]
    fn a_launcher_rank_outside_the_job_is_refused_naming_the_variable() {
        let refused = |vars: &[(&str, &str)], says: &str| {
            let err = rank_of(vars).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
            assert!(err.to_string().contains(says), "{err} lacks {says}");
        };
        refused(
            &[("RANK", "2"), ("WORLD_SIZE", "2")],
            "RANK=2 is out of range for WORLD_SIZE=2",
        );
        refused(
            &[("RANK", "abc"), ("WORLD_SIZE", "2")],
            "RANK=\"abc\" is not a rank",
        );
        refused(
            &[("RANK", "-1"), ("WORLD_SIZE", "2")],
            "RANK=\"-1\" is not a rank",
        );
        refused(&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE=0");
        refused(
            &[("RANK", "0"), ("WORLD_SIZE", "two")],
            "WORLD_SIZE=\"two\"",
        );
        refused(&[("RANK", "x")], "RANK=\"x\"");
        refused(
            &[("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")],
            "OMPI_COMM_WORLD_RANK=4 is out of range for OMPI_COMM_WORLD_SIZE=4",
        );
        refused(
            &[("PMI_RANK", ""), ("PMI_SIZE", "2")],
            "PMI_RANK=\"\" is not a rank",
        );
        refused(
            &[("SLURM_PROCID", "-1"), ("SLURM_NTASKS", "2")],
            "SLURM_PROCID=\"-1\"",
        );
    }
}
