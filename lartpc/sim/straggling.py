"""Energy-loss straggling in a thin layer: the restricted loss per step, fluctuated.

Landau's distribution describes the ionisation loss Delta in a layer whose Landau
parameter xi = (K/2)(Z/A) rho x / beta^2 is small compared with the largest energy
transfer: Delta = Delta_p + xi (lambda + 0.22278), lambda Landau distributed, with full
width at half maximum w = 4.018 xi and most probable loss Delta_p (PDG Review,
"Passage of particles through matter", Eq. 34.12 and the text after it: w = 4 xi,
Bichsel, Rev. Mod. Phys. 60 (1988) 663). For a minimum-ionising particle crossing one
0.3 cm wire pitch of liquid argon xi = 0.029 MeV, Delta_p ~ 0.44-0.50 MeV and
FWHM / MPV ~ 0.23-0.26 (minimum to Fermi plateau).

The generator tracks delta electrons above a cut explicitly, so a step's local loss is
the *restricted* loss: only transfers below T_cut = min(delta cut, T_max). Landau's
large-lambda tail is the single-collision spectrum xi / T^2, so truncating lambda at
lambda_cut = T_cut / xi removes exactly the transfers the delta rays carry. A step's
local deposit is then

    restricted mean + s * xi * (lambda - E[lambda | lambda < lambda_cut]),

which keeps the restricted mean exactly (Bragg peaks, ranges and calorimetry stay as
they were) and has Landau's width. ``s`` = 1 while the truncated Landau's variance
exceeds Bohr's ``xi T_cut (1 - beta^2 T_cut / 2 T_max)`` (thin layers, fast particles);
in thick layers of slow particles (kappa = xi / T_max >~ 1, the Vavilov-to-Gaussian
regime) ``s`` scales the width down to Bohr's Gaussian value. Each 0.3 cm track step is
straggled as three 0.1 cm pieces (Landau's law is stable under addition), so any 0.3 cm
of track, aligned with a wire or not, has the thin-layer width.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import landau

#: Landau's lambda at the most probable loss
LAMBDA_MPV = -0.22278
# scipy's landau has scale 2/pi relative to Landau's lambda: lambda = pi/2 x + ln(pi/2)
_X = np.concatenate([np.linspace(-3.2, 14.0, 3000), np.geomspace(14.01, 1.5e4, 1500)])
_LAM = 0.5 * np.pi * _X + np.log(0.5 * np.pi)
_CDF = landau.cdf(_X)
_PDF = landau.pdf(_X) * 2 / np.pi  # density in lambda
_M1 = np.concatenate([[0.0], np.cumsum(0.5 * np.diff(_LAM) * (_LAM * _PDF)[1:]
                                       + 0.5 * np.diff(_LAM) * (_LAM * _PDF)[:-1])])
_M2 = np.concatenate([[0.0], np.cumsum(0.5 * np.diff(_LAM) * (_LAM**2 * _PDF)[1:]
                                       + 0.5 * np.diff(_LAM) * (_LAM**2 * _PDF)[:-1])])
_M1 += _CDF[0] * _LAM[0]
_M2 += _CDF[0] * _LAM[0] ** 2


def truncated_moments(lam_cut: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P(lambda < cut), E[lambda | lambda < cut], Var[lambda | lambda < cut])."""
    # below lambda ~ 1 (T_cut under a few xi) the layer is thick: Bohr's width rules
    c = np.clip(lam_cut, 1.0, _LAM[-1])
    p = np.interp(c, _LAM, _CDF)
    m1 = np.interp(c, _LAM, _M1) / p
    m2 = np.interp(c, _LAM, _M2) / p
    return p, m1, np.maximum(m2 - m1 * m1, 1e-6)


def fluctuate(mean_mev: np.ndarray, xi_mev: np.ndarray, t_cut_mev: np.ndarray,
              t_max_mev: np.ndarray, beta2: np.ndarray, rng: np.random.Generator
              ) -> np.ndarray:
    """Local (restricted) energy loss per step, straggled.

    Parameters
    ----------
    mean_mev : restricted mean loss of each step.
    xi_mev : Landau parameter of each step, (K/2)(Z/A) rho ds / beta^2.
    t_cut_mev : largest local transfer, min(delta cut, T_max).
    t_max_mev : kinematic maximum transfer T_max.
    beta2 : beta^2 of the particle on each step.
    rng : random stream.

    Returns
    -------
    Non-negative losses with mean ``mean_mev`` (before the clip at 0, which only bites
    for steps whose mean is a few xi).
    """
    xi = np.maximum(xi_mev, 1e-12)
    lam_cut = t_cut_mev / xi
    p, m1, var = truncated_moments(lam_cut)
    lam = np.interp(rng.random(len(xi)) * p, _CDF, _LAM)
    # variance of the transfers below T_cut: xi T_cut (1 - beta^2 T_cut / (2 T_max))
    bohr = lam_cut * (1 - 0.5 * beta2 * t_cut_mev / np.maximum(t_max_mev, t_cut_mev))
    s = np.minimum(1.0, np.sqrt(np.maximum(bohr, 0.0) / var))
    return np.maximum(mean_mev + s * xi * (lam - m1), 0.0)
